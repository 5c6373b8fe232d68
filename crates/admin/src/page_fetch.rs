//! Maintenance pages given by URL (`"maintenance": {"page_url": …}`), fetched once when the
//! app is written and kept in the store as its `page_html`: every router of the fleet then
//! answers the stored copy, and a status host that is down or slow never reaches the
//! request path. A page that cannot be had refuses the write, naming the field, so the
//! operator learns it now rather than when the app goes into maintenance.
//!
//! One GET over HTTP/1.1 (hyper's client; OpenSSL with the system's roots for https),
//! following at most [`MAX_REDIRECTS`] redirects, all within [`FETCH_WITHIN`]; the answer
//! must be a 200 of HTML (or of no declared type) in UTF-8, at most the model's page limit.

use std::pin::Pin;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HOST, LOCATION, USER_AGENT};
use http::{HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use openssl::ssl::{SslConnector, SslMethod};
use switchyard_model::{App, ValidationError, MAX_PAGE_BYTES};
use tokio::net::TcpStream;
use tokio_openssl::SslStream;

/// The whole fetch, redirects included.
const FETCH_WITHIN: Duration = Duration::from_secs(10);
/// Redirects followed before giving up.
const MAX_REDIRECTS: usize = 3;

type Failure = String;

/// Fetches the maintenance page of `app` when it is given by URL, keeping it as the
/// page's HTML; an error names `maintenance.page_url`.
pub(crate) async fn fill_maintenance_page(app: &mut App) -> Result<(), ValidationError> {
    let Some(maintenance) = app.maintenance.as_deref_mut() else {
        return Ok(());
    };
    let Some(url) = maintenance.page_url.clone() else {
        return Ok(());
    };
    let page = match tokio::time::timeout(FETCH_WITHIN, fetch(&url)).await {
        Ok(Ok(page)) => page,
        Ok(Err(why)) => {
            return Err(ValidationError::new(
                "maintenance.page_url",
                format!("cannot fetch {url}: {why}"),
            ))
        }
        Err(_) => {
            return Err(ValidationError::new(
                "maintenance.page_url",
                format!("cannot fetch {url}: no whole answer within {FETCH_WITHIN:?}"),
            ))
        }
    };
    maintenance.page_html = Some(page);
    Ok(())
}

async fn fetch(url: &str) -> Result<String, Failure> {
    let mut uri: Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
    for _ in 0..=MAX_REDIRECTS {
        let response = get(&uri).await?;
        let status = response.status();
        if status.is_redirection() {
            let location = response
                .headers()
                .get(LOCATION)
                .and_then(|l| l.to_str().ok())
                .ok_or_else(|| format!("answered {status} without a Location"))?;
            uri = follow(&uri, location)?;
            continue;
        }
        if status != StatusCode::OK {
            return Err(format!("answered {status}, not 200"));
        }
        if let Some(kind) = response.headers().get(CONTENT_TYPE) {
            let media = kind.to_str().unwrap_or_default();
            let media = media.split(';').next().unwrap_or_default().trim();
            if !media.eq_ignore_ascii_case("text/html") {
                return Err(format!("answered {media:?}, not text/html"));
            }
        }
        let body = Limited::new(response.into_body(), MAX_PAGE_BYTES)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    format!("the page is larger than {MAX_PAGE_BYTES} bytes")
                } else {
                    format!("the answer broke off: {e}")
                }
            })?
            .to_bytes();
        let page = String::from_utf8(body.to_vec()).map_err(|_| "the page is not UTF-8")?;
        if page.trim().is_empty() {
            return Err("the page is empty".into());
        }
        return Ok(page);
    }
    Err(format!("more than {MAX_REDIRECTS} redirects"))
}

/// Where a redirect's `Location` leads from `from`: absolute, or a path on the same
/// origin.
fn follow(from: &Uri, location: &str) -> Result<Uri, Failure> {
    let absolute = if location.starts_with('/') && !location.starts_with("//") {
        let scheme = from.scheme_str().unwrap_or("http");
        let authority = from.authority().map_or("", |a| a.as_str());
        format!("{scheme}://{authority}{location}")
    } else {
        location.to_string()
    };
    let uri: Uri = absolute
        .parse()
        .map_err(|_| format!("redirected to {location:?}, not a URL"))?;
    match uri.scheme_str() {
        Some("http" | "https") if uri.host().is_some() => Ok(uri),
        _ => Err(format!("redirected to {location:?}, not an http(s) URL")),
    }
}

async fn get(uri: &Uri) -> Result<hyper::Response<hyper::body::Incoming>, Failure> {
    let host = uri.host().ok_or("the URL names no host")?;
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err("the URL is neither http nor https".into()),
    };
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let name = host.trim_start_matches('[').trim_end_matches(']');
    let tcp = TcpStream::connect((name, port))
        .await
        .map_err(|e| format!("cannot connect to {host}:{port}: {e}"))?;
    let authority = uri.authority().map_or(host, |a| a.as_str());
    let request = Request::get(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(
            HOST,
            HeaderValue::from_str(authority).map_err(|e| e.to_string())?,
        )
        .header(USER_AGENT, "switchyard-maintenance-page")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    if !tls {
        return send(tcp, request).await;
    }
    let connector = connector()?;
    let ssl = connector
        .configure()
        .and_then(|c| c.into_ssl(name))
        .map_err(|e| e.to_string())?;
    let mut stream = SslStream::new(ssl, tcp).map_err(|e| e.to_string())?;
    Pin::new(&mut stream)
        .connect()
        .await
        .map_err(|e| format!("TLS with {host}:{port} failed: {e}"))?;
    send(stream, request).await
}

async fn send<S>(
    stream: S,
    request: Request<Empty<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, Failure>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            log::debug!("admin: maintenance page connection ended: {e}");
        }
    });
    sender
        .send_request(request)
        .await
        .map_err(|e| format!("no answer: {e}"))
}

/// OpenSSL's client context with the system's roots, made on the first https page.
fn connector() -> Result<SslConnector, Failure> {
    static CONNECTOR: OnceLock<Result<SslConnector, String>> = OnceLock::new();
    CONNECTOR
        .get_or_init(|| {
            SslConnector::builder(SslMethod::tls_client())
                .map(|builder| builder.build())
                .map_err(|e| format!("cannot set up TLS: {e}"))
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_lead_to_absolute_http_urls_only() {
        let from: Uri = "https://status.example.com/a/b".parse().expect("a URL");
        assert_eq!(
            follow(&from, "/down.html").expect("a path").to_string(),
            "https://status.example.com/down.html"
        );
        assert_eq!(
            follow(&from, "http://other.example/x")
                .expect("absolute")
                .to_string(),
            "http://other.example/x"
        );
        for refused in ["ftp://example.com/x", "//evil.example/x", "down.html"] {
            assert!(follow(&from, refused).is_err(), "{refused}");
        }
    }
}
