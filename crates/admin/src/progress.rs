//! The progress of a long write — a sync, an import — for a client that asks for it with
//! `Accept: application/x-ndjson` (the CLI, on a terminal, to draw a progress bar): one JSON
//! line per step (`{"compared": N, "writes": W}`, then `{"written": N, "left": M}` after each
//! batch), and last the answer itself, `{"status": S, "answer": {…}}`. The HTTP status is
//! 200 once the stream starts: the last line carries the write's own. The audit record waits
//! for that last line.

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::audit::AuditDetail;
use crate::ApiError;

/// The media type of the steps, asked for and answered.
const STEPS: &str = "application/x-ndjson";
/// Apps written per store call by a long write (on the embedded store, one transaction
/// each), and a step reported after each.
pub(crate) const WRITE_BATCH: usize = 1000;
/// Progress lines that may wait for a slow reader; beyond, the write waits for it.
const QUEUED_LINES: usize = 64;
/// Largest answer carried on the last line.
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// Where a write reports its steps, when its client asked for them.
pub(crate) type Progress = Option<mpsc::Sender<String>>;

/// How a streamed write ended: its status and what the audit record says it changed.
pub(crate) type Outcome = oneshot::Receiver<(u16, Value)>;

/// The [`Outcome`] of a streamed write, for the audit record (taken once).
#[derive(Clone)]
pub(crate) struct AuditLater(pub(crate) Arc<Mutex<Option<Outcome>>>);

/// Whether the request asks for its progress.
fn wanted(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains(STEPS))
}

/// Sends one step; a client gone away is not the write's concern.
pub(crate) async fn report(progress: &Progress, step: Value) {
    if let Some(sender) = progress {
        let _ = sender.send(format!("{step}\n")).await;
    }
}

/// The answer of a long write: streamed with its steps when the request asks for them
/// ([`wanted`]), otherwise as the write answers once done.
pub(crate) async fn answer<W, F>(headers: &HeaderMap, work: W) -> Response
where
    W: FnOnce(Progress) -> F,
    F: Future<Output = Result<Response, ApiError>> + Send + 'static,
{
    if wanted(headers) {
        return streamed(move |progress| {
            let running = work(progress);
            async move { running.await.unwrap_or_else(IntoResponse::into_response) }
        });
    }
    work(None).await.unwrap_or_else(IntoResponse::into_response)
}

/// Runs `work` in a task of its own, streaming its steps and, last, its answer.
fn streamed<W, F>(work: W) -> Response
where
    W: FnOnce(Progress) -> F,
    F: Future<Output = Response> + Send + 'static,
{
    let (sender, receiver) = mpsc::channel(QUEUED_LINES);
    let (finished, outcome) = oneshot::channel();
    let running = work(Some(sender.clone()));
    tokio::spawn(async move {
        let response = running.await;
        let status = response.status().as_u16();
        let detail = response
            .extensions()
            .get::<AuditDetail>()
            .map_or_else(|| json!({}), |d| d.0.clone());
        let body = axum::body::to_bytes(response.into_body(), MAX_ANSWER_BYTES)
            .await
            .unwrap_or_default();
        let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let _ = finished.send((status, detail));
        let _ = sender
            .send(format!("{}\n", json!({"status": status, "answer": answer})))
            .await;
    });
    let lines = futures_util::stream::unfold(receiver, |mut receiver| async move {
        let line = receiver.recv().await?;
        Some((Ok::<_, Infallible>(Bytes::from(line)), receiver))
    });
    let mut response = Response::new(Body::from_stream(lines));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(STEPS));
    response
        .extensions_mut()
        .insert(AuditLater(Arc::new(Mutex::new(Some(outcome)))));
    response
}
