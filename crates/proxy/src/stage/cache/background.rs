//! Revalidation in the background (RFC 5861 `stale-while-revalidate`): the request that
//! finds a copy stale within the answer's window is answered with it at once, and the
//! router asks the app itself — a conditional GET through the app's own attempts (a backend
//! that cannot be reached is marked down, the connection is in the table a drain reads), on
//! a connection of the thread's refresh pool — and refreshes the copy for the requests
//! after it. The URL's fill lock is held meanwhile: the requests arriving in between get the
//! stale copy too, and one refresh per URL is in flight.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap, HeaderValue, Method, Request, Version};
use http_body_util::{BodyExt, Empty};
use switchyard_model::ResponseCache;

use super::copies::{copy_of, refreshed_copy, replace, storable, stored_fields, Refresh};
use super::validators;
use crate::context::RequestCtx;
use crate::metrics;
use crate::response_cache::memory::CachedResponse;
use crate::routing::connections::{ConnectionTable, ShutdownRequest};
use crate::upstream::attempt::{self, SideConnectFailure};
use crate::upstream::outbound::SidePool;

/// How a background refresh ended, for `switchyard_cache_background_revalidations_total`.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    /// A 304: the copy's fields and freshness refreshed.
    NotModified,
    /// A new answer, kept in the copy's place.
    Replaced,
    /// An answer the cache does not keep, or an error status: the stale copy stays.
    Kept,
    /// No answer (unreachable, late, too large).
    Failed,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Self::NotModified => "not_modified",
            Self::Replaced => "replaced",
            Self::Kept => "kept",
            Self::Failed => "failed",
        }
    }
}

/// Runs `refresh` on a connection of `pool`; never fails the request that started it.
pub(crate) async fn run(refresh: Refresh, pool: Arc<SidePool>, connections: Arc<ConnectionTable>) {
    let (outcome, copy) = match exchange(&refresh, &pool, &connections).await {
        Ok(done) => done,
        Err(reason) => {
            log::info!(
                "app {}: the background revalidation of {} failed: {reason}",
                refresh.route.app.name.as_str(),
                refresh.key
            );
            (Outcome::Failed, None)
        }
    };
    metrics::CACHE_BACKGROUND_REVALIDATIONS
        .with_label_values(&[outcome.label()])
        .inc();
    if let Some(copy) = copy {
        keep(refresh, copy);
    }
}

/// What came of the refresh, and the copy to keep in the stale one's place.
type Exchanged = (Outcome, Option<Arc<CachedResponse>>);

async fn exchange(
    refresh: &Refresh,
    pool: &SidePool,
    connections: &Arc<ConnectionTable>,
) -> Result<Exchanged, String> {
    let Some(policy) = refresh.route.app.cache.as_deref() else {
        return Ok((Outcome::Kept, None));
    };
    let timeouts = &refresh.route.app.timeouts;
    let connect_timeout = Duration::from_millis(timeouts.connect_ms);
    let read_timeout = Duration::from_millis(timeouts.read_ms);
    let mut ctx = RequestCtx::new();
    ctx.route = Some(refresh.route.clone());
    ctx.host = refresh.host.clone();
    ctx.tls = refresh.tls;
    let mut connection = attempt::connect_side(&mut ctx, pool, connect_timeout)
        .await
        .map_err(|failure| match failure {
            SideConnectFailure::NoBackend(_) => "the app has no reachable container".to_string(),
            SideConnectFailure::Connect(e) => e.to_string(),
        })?;
    let shutdown = Arc::new(ShutdownRequest::default());
    attempt::register_connection(&mut ctx, connections, shutdown.clone());
    let sent_at = SystemTime::now();
    let answer = tokio::select! {
        answer = read_answer(refresh, &mut connection, policy, read_timeout) => answer,
        () = shutdown.requested() => Err("the app's container was removed".to_string()),
    };
    ctx.release_attempt();
    let (status, headers, body, read_whole) = answer?;
    if read_whole {
        pool.put(connection);
    }
    if status == 304 {
        let refreshed = refreshed_copy(policy, &refresh.stale, &headers, Some(sent_at));
        return Ok((Outcome::NotModified, Some(refreshed)));
    }
    let replacement = body.and_then(|body| {
        let (freshness, _) = storable(policy, status, &headers, Some(sent_at))?;
        let kept = stored_fields(&headers, policy.cache_set_cookie);
        let received = std::time::Instant::now();
        Some(Arc::new(copy_of(status, kept, body, &freshness, received)))
    });
    Ok(match replacement {
        Some(copy) => (Outcome::Replaced, Some(copy)),
        None => (Outcome::Kept, None),
    })
}

/// Stores `copy` in the stale one's place — the URL's lock goes once it can be read back —
/// or forgets the stale one when the refreshed answer may not be kept any more.
fn keep(refresh: Refresh, copy: Arc<CachedResponse>) {
    let app = refresh.route.app.name.as_str();
    let shared = refresh.shared.as_ref();
    replace(
        &refresh.cache,
        shared,
        app,
        refresh.key.clone(),
        copy,
        Some(refresh.guard),
    );
}

/// Sends the conditional GET and reads the answer: its status, fields, for a 2xx its body
/// when it fits the app's largest kept answer, and whether it was read to its end (the
/// connection can then serve again).
async fn read_answer(
    refresh: &Refresh,
    connection: &mut crate::upstream::outbound::SideConnection,
    policy: &ResponseCache,
    read_timeout: Duration,
) -> Result<(u16, HeaderMap, Option<Bytes>, bool), String> {
    let mut request = Request::builder()
        .method(Method::GET)
        .uri(refresh.path_and_query.as_str())
        .version(Version::HTTP_11)
        .body(Empty::new().map_err(|never| match never {}).boxed_unsync())
        .map_err(|e| e.to_string())?;
    let headers = request.headers_mut();
    *headers = refresh.request_headers.clone();
    if let Some(host) = refresh
        .host
        .as_deref()
        .and_then(|h| HeaderValue::from_str(h).ok())
    {
        headers.insert(header::HOST, host);
    }
    validators::ask_if_changed(headers, &refresh.stale.headers);
    let response = tokio::time::timeout(read_timeout, connection.sender.send_request(request))
        .await
        .map_err(|_| "the app did not answer in time".to_string())?
        .map_err(|e| e.to_string())?;
    let (parts, mut body) = response.into_parts();
    let status = parts.status.as_u16();
    if !(200..300).contains(&status) {
        return Ok((status, parts.headers, None, status == 304));
    }
    let mut collected = BytesMut::new();
    let reading = async {
        while let Some(frame) = body.frame().await {
            if let Ok(piece) = frame.map_err(|e| e.to_string())?.into_data() {
                if (collected.len() + piece.len()) as u64 > policy.max_object_bytes {
                    return Ok(false);
                }
                collected.extend_from_slice(&piece);
            }
        }
        Ok::<_, String>(true)
    };
    let whole = tokio::time::timeout(read_timeout, reading)
        .await
        .map_err(|_| "the app's answer was late".to_string())??;
    Ok((
        status,
        parts.headers,
        whole.then(|| collected.freeze()),
        whole,
    ))
}
