//! The WAF's body phase: the decisions of `waf`, with the body pulled from the client
//! here. A body the rules must see is read before anything goes to the backend and
//! held — in memory when small, in the spool file otherwise, read back whole once it
//! passes. The backend then gets the held
//! bytes, and after them the rest of the body (past `max_body_bytes`) as it comes.

use std::cell::Cell;
use std::pin::Pin;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body as _, Frame};

use super::{self as waf, BodyInspection, Endpoints, Inspector, OwnedRequest, SpoolRefusal};
use crate::context::RequestCtx;
use crate::request_body::{Held, RequestBody};
use crate::respond::{Reason, Refusal};

/// Inspects a request of an app with a WAF: `Ok` with the body read for it (if any) when it
/// may go on, `Err` with the answer otherwise. `incoming` is left where the inspection
/// stopped reading it; each read waits at most `read_deadline`, and is counted in
/// `bytes_in`.
pub(crate) async fn inspect(
    head: &http::request::Parts,
    incoming: &mut RequestBody,
    endpoints: Endpoints,
    ctx: &RequestCtx,
    inspector: Option<&Inspector>,
    read_deadline: Duration,
    bytes_in: &Cell<usize>,
) -> Result<Option<Held>, Refusal> {
    let Some(policy) = waf::policy_of(ctx) else {
        return Ok(None);
    };
    let request = OwnedRequest::head_only(head, endpoints);
    let Some(inspector) = inspector else {
        return go_on(waf::inspect_now(ctx, None, policy, request).await);
    };
    let mut body = InspectedBody {
        incoming,
        read_deadline,
        bytes_in,
        trailers: None,
    };
    let has_body = !body.incoming.is_end_stream();
    let inspection = waf::body_inspection(ctx.app_name(), &policy, has_body, ctx.declared_length);
    if let (RequestBody::Buffered(buffered), BodyInspection::InMemory | BodyInspection::Spooled) =
        (&mut *body.incoming, inspection)
    {
        // Read whole by request buffering: inspected where it is, with no copy.
        if let Some((file, length)) = buffered.spool_file() {
            let inspected =
                waf::inspect_buffered_spool(ctx, inspector, policy, request, file, length);
            return go_on(inspected.await);
        }
        if let Some((data, trailers)) = buffered.take_in_memory() {
            let inspected = data.slice(..data.len().min(policy.max_body_bytes as usize));
            if inspected.len() < data.len() {
                crate::metrics::WAF_BODY_UNINSPECTED
                    .with_label_values(&[ctx.app_name()])
                    .inc();
            }
            let request = request.with_body(inspected);
            go_on(waf::inspect_now(ctx, Some(inspector), policy, request).await)?;
            return Ok(Some(Held { data, trailers }));
        }
    }
    match inspection {
        BodyInspection::None => {
            go_on(waf::inspect_now(ctx, Some(inspector), policy, request).await)
        }
        BodyInspection::InMemory => {
            // The body is held to its declared length (the HTTP/1 driver by its framing,
            // hyper's HTTP/2 server by the stream's), at most IN_MEMORY_BODY here.
            let mut data = BytesMut::new();
            while let Some(piece) = body.next_piece(ctx).await? {
                data.extend_from_slice(&piece);
            }
            let data = data.freeze();
            let request = request.with_body(data.clone());
            go_on(waf::inspect_now(ctx, Some(inspector), policy, request).await)?;
            Ok(Some(Held {
                data,
                trailers: body.trailers,
            }))
        }
        BodyInspection::Spooled => {
            if let Some(answer) = waf::refuse_on_head(ctx, inspector, policy, request.clone()).await
            {
                return Err(answer.into());
            }
            let mut spool = inspector.start_spool(request, policy);
            let mut past_limit = None;
            while let Some(mut piece) = body.next_piece(ctx).await? {
                past_limit = spool.split_past_limit(&mut piece);
                if let Err(refusal) = spool.append(piece.clone()).await {
                    log::warn!("request {}: WAF spool: {refusal}", ctx.request_id);
                    let held = spool.give_up(ctx).await.map_err(refused)?;
                    return Ok(Some(Held {
                        data: joined(&[held, piece, past_limit.unwrap_or_default()]),
                        trailers: None,
                    }));
                }
                if past_limit.is_some() {
                    break;
                }
            }
            let held = spool
                .finish(ctx, inspector, past_limit.is_some())
                .await
                .map_err(refused)?;
            Ok(Some(Held {
                data: joined(&[held, past_limit.unwrap_or_default()]),
                trailers: body.trailers,
            }))
        }
    }
}

fn go_on(refusal: Option<Reason>) -> Result<Option<Held>, Refusal> {
    match refusal {
        Some(answer) => Err(answer.into()),
        None => Ok(None),
    }
}

fn refused(refusal: SpoolRefusal) -> Refusal {
    match refusal {
        SpoolRefusal::Answer(answer) => answer.into(),
        SpoolRefusal::Unreadable(e) => {
            log::error!("the WAF spool could not be read back: {e}");
            Reason::WafSpoolUnreadable.into()
        }
    }
}

fn joined(parts: &[Bytes]) -> Bytes {
    let mut filled = parts.iter().filter(|part| !part.is_empty());
    match (filled.next(), filled.next()) {
        (None, _) => Bytes::new(),
        (Some(only), None) => only.clone(),
        _ => {
            let mut whole = BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
            for part in parts {
                whole.extend_from_slice(part);
            }
            whole.freeze()
        }
    }
}

/// The client's body as the inspection reads it.
struct InspectedBody<'a> {
    incoming: &'a mut RequestBody,
    read_deadline: Duration,
    bytes_in: &'a Cell<usize>,
    trailers: Option<HeaderMap>,
}

impl InspectedBody<'_> {
    /// The next piece of data, `None` at the end; a client that stops sending gets 408, one
    /// whose body breaks (a reset, a malformed chunk) 400.
    async fn next_piece(&mut self, ctx: &RequestCtx) -> Result<Option<Bytes>, Refusal> {
        loop {
            let incoming = &mut *self.incoming;
            let next = std::future::poll_fn(|cx| Pin::new(&mut *incoming).poll_frame(cx));
            let frame = match tokio::time::timeout(self.read_deadline, next).await {
                Ok(None) => return Ok(None),
                Ok(Some(Ok(frame))) => frame,
                Ok(Some(Err(e))) => {
                    log::debug!(
                        "request {}: the body for the WAF stopped: {e}",
                        ctx.request_id
                    );
                    return Err(Reason::WafBodyBroken.into());
                }
                Err(_) => {
                    log::debug!(
                        "request {}: no body for the WAF within {:?}",
                        ctx.request_id,
                        self.read_deadline
                    );
                    return Err(Reason::WafBodyTimedOut.into());
                }
            };
            match Frame::into_data(frame) {
                Ok(data) => {
                    if !self.incoming.counted_already() {
                        self.bytes_in.set(self.bytes_in.get() + data.len());
                    }
                    return Ok(Some(data));
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        self.trailers = Some(trailers);
                    }
                }
            }
        }
    }
}
