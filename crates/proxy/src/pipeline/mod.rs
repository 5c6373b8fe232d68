//! The life of one request, in the phases Pingora's `ProxyHttp` names. The order of the
//! stages is not written here but in `stage::list`; each phase runs the stages of the
//! request's app's chain (`stage::chain`, built with its route) that take part in it,
//! around the steps every request takes:
//!
//! 1. **request head** — request id, framing, route, ACME challenge (every request); then
//!    the chain's (redirects, the app's pages, limits, HTTPS redirect, basic auth, the
//!    notes of affinity and compression). Each answers (a [`Flow`] that breaks with a
//!    [`Refusal`], a redirect) or lets the request go on.
//! 2. **request body** — the body is read whole (`stage::request_buffer`) unless the app
//!    streams it; the WAF inspects the body it must see, and holds it
//!    (`stage::waf::inspect`); the filters read it whole.
//! 3. **answer in place of the app** — a static file, a fresh copy from the cache, a
//!    resized image.
//! 4. **upstream request** — a copy starts towards the mirror, the cache asks for what it
//!    needs; the request goes to a backend (`crate::upstream`: choose, connect, register,
//!    retry, mark down, map failures).
//! 5. **answer head** — backwards: compression, the cache's decision (kept, or a stale
//!    copy in its place), the sticky cookie; `answer::write` writes every answer, the
//!    app's or the router's own.
//! 6. **end** — when the answer is done or the client leaves, the request is logged and
//!    counted (`end::RequestEnd`, dropped with the answer's body).

mod answer;
pub(crate) mod answer_body;
pub(crate) mod client;
pub(crate) mod end;

use std::cell::Cell;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use crate::routing::route_cache::AppRoute;
use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, COOKIE, HOST};
use http::{HeaderMap, HeaderValue, Request, Response, Uri, Version};
use http_body::Body as _;

pub(crate) use answer::{before_request, RouterFields};
use answer::{Answer, Flow, X_CACHE};
use answer_body::AnswerBody;
use client::Client;
use end::RequestEnd;

use crate::context::RequestCtx;
use crate::event_loop::EventLoop;
use crate::fields_mut::FieldsMut;
use crate::forwarded::Forwarding;
use crate::isolation::fair_share;
use crate::listener::relay::ClientUpgrade;
use crate::request_body::Held;
use crate::request_body::RequestBody;
use crate::request_fields::{Fields, Known, RequestFields};
use crate::respond::{Reason, Refusal};
use crate::stage::acme_challenge;
use crate::stage::affinity;
use crate::stage::app_pages;
use crate::stage::basic_auth;
use crate::stage::cache;
use crate::stage::compress;
use crate::stage::filters;
use crate::stage::framing;
use crate::stage::https;
use crate::stage::images::{self, ImageAnswer};
use crate::stage::limits;
use crate::stage::list::{Phase, Stage};
use crate::stage::mirror;
use crate::stage::redirects;
use crate::stage::request_buffer;
use crate::stage::request_id::request_id;
use crate::stage::route;
use crate::stage::static_files;
use crate::stage::waf;
use crate::upstream::forward_body::ForwardBody;
use crate::upstream::{self, AnswerForm, Outgoing, RequestEdits};

/// Serves one request. `client_upgrade`: where the client's connection comes once a 101
/// has gone out, for a request that asks for an upgrade.
pub(crate) async fn handle(
    request: Request<RequestBody>,
    as_read: Option<RequestFields>,
    client: Rc<Client>,
    worker: Rc<EventLoop>,
    client_upgrade: Option<ClientUpgrade>,
) -> Response<AnswerBody> {
    let bytes_in = Rc::new(Cell::new(0));
    let mut end = Box::new(RequestEnd {
        worker: worker.clone(),
        // Made in place: a named local, though moved from, would keep its 416 bytes in
        // this future's state for the whole request (rustc -Zprint-type-sizes).
        ctx: {
            let mut ctx = RequestCtx::new();
            ctx.tls = client.tls;
            ctx.server_port = client.server_port();
            ctx.request_id = request_id(Fields::of(request.headers(), as_read.as_ref()));
            ctx
        },
        method: request.method().clone(),
        target: request.uri().clone(),
        version: request.version(),
        connection: client.clone(),
        bytes_in: bytes_in.clone(),
        status: 0,
        bytes_out: 0,
        answer_fields: None,
    });
    let version = request.version();
    let (head, incoming) = request.into_parts();
    let mut unread = Some(incoming);
    let mut answer = proxy(
        head,
        as_read,
        &mut unread,
        &client,
        &mut end.ctx,
        &worker,
        bytes_in,
    )
    .await;
    end.ctx.weight.answer_ready();
    if matches!(&answer, Answer::Refused(refusal) if refusal.is_failure()) {
        // The app failed or could not be reached: a stale copy stands in if one may.
        if let Some(stale) = cache::stand_in_for_failure(&mut end.ctx) {
            answer = Answer::Cached(stale);
        }
    }
    let mut response = answer::write(answer, client_upgrade, end);
    if let Some(incoming) =
        unread.filter(|body| version <= Version::HTTP_11 && !body.is_end_stream())
    {
        linger(incoming, &mut response);
    }
    response
}

/// How long the rest of a body the router answered without reading may take to come in
/// before the connection is closed anyway (nginx's `lingering_timeout`).
const REFUSED_BODY_LINGER: Duration = Duration::from_secs(5);

/// An HTTP/1 client may still be sending the body of a request the router has answered (a
/// refused upload, an unknown host): closing with its bytes unread would reset the
/// connection, and the client could lose the answer. The connection closes after this
/// answer instead, and the rest of the body is read and dropped meanwhile, for a bounded
/// time. An HTTP/2 or HTTP/3 stream ends on its own, the rest of it refused without
/// touching the connection; the answer's version cannot tell them apart (it is HTTP/1.1
/// here whatever the client speaks), the request's does.
fn linger(mut incoming: RequestBody, response: &mut Response<AnswerBody>) {
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    tokio::task::spawn_local(async move {
        let drained = async {
            while let Some(Ok(_)) =
                std::future::poll_fn(|cx| Pin::new(&mut incoming).poll_frame(cx)).await
            {
            }
        };
        let _ = tokio::time::timeout(REFUSED_BODY_LINGER, drained).await;
    });
}

/// The answer to a request, phase after phase; its body is taken from `unread` once it
/// goes to a backend, and left there otherwise. `as_read`: an HTTP/1.x client's fields
/// where they were read, when `head`'s map is empty; they are made a map for the stages
/// that read a request whole.
async fn proxy(
    mut head: http::request::Parts,
    mut as_read: Option<RequestFields>,
    unread: &mut Option<RequestBody>,
    client: &Client,
    ctx: &mut RequestCtx,
    worker: &EventLoop,
    bytes_in: Rc<Cell<usize>>,
) -> Answer {
    let Some(incoming) = unread.as_mut() else {
        return Refusal::upstream_failed(false).into();
    };
    let route = match request_phase(&mut head, &mut as_read, incoming, client, ctx, worker).await {
        Ok(route) => route,
        Err(answer) => return answer,
    };
    let held = match body_phase(&mut head, incoming, client, ctx, worker, &bytes_in).await {
        Ok(held) => held,
        Err(answer) => return answer,
    };
    if let Some(answer) = answer_in_place_of_app(&head, client, ctx, worker).await {
        return answer;
    }
    // The head, the fields and the body stay in this frame: moved into the phase's, they
    // would be copied whole on every request.
    upstream_phase(
        &mut head, &as_read, unread, held, &route, client, ctx, worker, bytes_in,
    )
    .await
}

/// The request phase: the stages that read the head answer, or let the request go on to
/// the route's app.
async fn request_phase(
    head: &mut http::request::Parts,
    as_read: &mut Option<RequestFields>,
    incoming: &mut RequestBody,
    client: &Client,
    ctx: &mut RequestCtx,
    worker: &EventLoop,
) -> Result<Arc<AppRoute>, Answer> {
    let held = client.pacing.wait_out(head.version).await;
    ctx.weight.held_for(held);
    match as_read {
        // Fields as read have neither Transfer-Encoding nor Upgrade (`client_h1`), and the
        // codec checked their lengths: the length declared is what is left to read.
        Some(fields) => {
            ctx.declared_length =
                framing::declared_length(Fields::AsRead(fields).get(Known::ContentLength));
        }
        None => ctx.declared_length = framing::check_request(&mut head.headers)?,
    }
    let shared = &worker.shared;
    let fields = Fields::of(&head.headers, as_read.as_ref());
    route::route(&head.uri, fields, ctx, &shared.routes).await?;
    if let Some(key_authorization) =
        acme_challenge::answer(&head.method, head.uri.path(), ctx, shared.routes.store()).await
    {
        let mut headers = HeaderMap::with_capacity(2);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        headers.insert(CONTENT_LENGTH, HeaderValue::from(key_authorization.len()));
        return Err(Answer::Made {
            headers,
            body: Bytes::from(key_authorization),
        });
    }
    let Some(route) = ctx.route.clone() else {
        return Err(Reason::UnknownHost.into());
    };
    let chain = route.chain;
    if as_read.is_some() && chain.reads_whole_request {
        match as_read.take().map(|fields| fields.to_map()) {
            Some(Ok(map)) => head.headers = map,
            _ => return Err(Reason::UnreadableFields.into()),
        }
    }
    let inspected = shared.waf.is_some() && chain.runs(Stage::Waf);
    let resized =
        shared.images.is_some() && chain.runs(Stage::Images) && images::wants_resize(ctx, head);
    let pool_backlogged = || {
        shared
            .pool
            .as_deref()
            .is_some_and(|pool| pool.has_backlog())
    };
    ctx.fair_turn = match fair_share::admit(&route.requests, inspected || resized, pool_backlogged)
    {
        Ok(None) => None,
        Ok(Some(fair_share::Admitted::Now(turn))) => Some(turn),
        Ok(Some(fair_share::Admitted::Waits(waiting))) => Some(Box::pin(waiting.turn()).await?),
        Err(refusal) => return Err(refusal.into()),
    };
    ctx.weight.start(inspected || resized);
    for stage in chain.in_phase(Phase::RequestHead) {
        let fields = as_read.as_ref();
        let flow = match on_request_head(stage, head, fields, client, ctx, worker) {
            Ok(flow) => flow,
            Err(Waits::Limits) => admit(&route, head, fields, client, ctx, worker).await,
            Err(Waits::Filters) => {
                let peer = client.endpoints().client;
                let peer = peer.unwrap_or_else(|| std::net::SocketAddr::new(client.ip(), 0));
                let filtered = filters::on_request_head(&route, head, peer, ctx, worker);
                filtered_flow(Box::pin(filtered).await)
            }
            Err(Waits::Password(unchecked)) => {
                let pool = shared.pool.as_deref();
                let checked = basic_auth::check(unchecked, &client.passwords, pool);
                match Box::pin(checked).await {
                    Ok(()) => Flow::Continue(()),
                    Err(denied) => Flow::Break(denied_answer(denied, client)),
                }
            }
        };
        if let Flow::Break(answer) = flow {
            return Err(answer);
        }
    }
    let body_deadline = shared.client_timeouts.body;
    // HTTP/2 and HTTP/3 alike: a stream that says "no body" and then sends one.
    if head.version >= Version::HTTP_2
        && ctx.declared_length == Some(0)
        && !incoming.is_end_stream()
        && !empty_body_ends(incoming, body_deadline).await
    {
        return Err(Reason::AmbiguousFraming.into());
    }
    Ok(route)
}

/// What a stage of the request's head waits for, when it cannot say at once.
enum Waits {
    /// The app's limits: a place among its requests in flight may be queued for.
    Limits,
    /// Credentials no check remembers: bcrypt on the worker pool.
    Password(Box<basic_auth::Unchecked>),
    /// The app's filters, which may call out or yield at their ticks.
    Filters,
}

/// What the filters said, as a stage's flow.
fn filtered_flow(outcome: filters::Outcome) -> Flow {
    match outcome {
        filters::Outcome::Continue => Flow::Continue(()),
        filters::Outcome::Answer(local) => Flow::Break(Answer::Filtered(local)),
        filters::Outcome::Refused(refusal) => Flow::Break(refusal.into()),
    }
}

/// A stage of the app's chain on the request's head: it answers, or the request goes on,
/// or it waits (`Waits`). A function, not a future: the stages that answer at once (all
/// but a queue or a password check) cost a call each, no future made and polled.
fn on_request_head(
    stage: Stage,
    head: &mut http::request::Parts,
    as_read: Option<&RequestFields>,
    client: &Client,
    ctx: &mut RequestCtx,
    worker: &EventLoop,
) -> Result<Flow, Waits> {
    let shared = &worker.shared;
    match stage {
        Stage::Redirects => {
            if let Some((status, location)) = redirects::redirect(&head.uri, ctx) {
                return Ok(Flow::Break(Answer::Redirect { status, location }));
            }
        }
        Stage::AppPages => {
            let fields = Fields::of(&head.headers, as_read);
            app_pages::note_html_client(ctx, &head.method, fields);
            if let Some(retry_after_s) = app_pages::in_maintenance(ctx) {
                return Ok(Flow::Break(Answer::Maintenance { retry_after_s }));
            }
        }
        Stage::Limits => return Err(Waits::Limits),
        Stage::Filters => return Err(Waits::Filters),
        Stage::Https => {
            if let Some(location) = https::redirect_location(&head.uri, ctx, shared.https_port) {
                return Ok(Flow::Break(Answer::Redirect {
                    status: 308,
                    location,
                }));
            }
        }
        Stage::BasicAuth => {
            let fields = Fields::of(&head.headers, as_read);
            let on_connection = (client.ip(), &client.passwords);
            match basic_auth::screen(ctx, head.uri.path(), fields, on_connection) {
                Ok(None) => {}
                Ok(Some(unchecked)) => return Err(Waits::Password(unchecked)),
                Err(denied) => return Ok(Flow::Break(denied_answer(denied, client))),
            }
        }
        Stage::Affinity => affinity::note_cookie(ctx, Fields::of(&head.headers, as_read)),
        Stage::Compress => compress::note_request(ctx, &mut head.headers, as_read),
        _ => {}
    }
    Ok(Flow::Continue(()))
}

/// The app's limits on the request: refused, or let through with its places taken.
async fn admit(
    route: &AppRoute,
    head: &http::request::Parts,
    as_read: Option<&RequestFields>,
    client: &Client,
    ctx: &mut RequestCtx,
    worker: &EventLoop,
) -> Flow {
    let Some(limits) = route.app.limits.as_deref() else {
        return Flow::Continue(());
    };
    let request = limits::Request {
        app: route.app.name.as_str(),
        limits,
        peer: client.ip(),
        fields: Fields::of(&head.headers, as_read),
        target_len: head.uri.path_and_query().map_or(0, |p| p.as_str().len()),
        declared_length: ctx.declared_length,
    };
    match worker.shared.limiter.admit(request).await {
        Ok(places) => ctx.limit_places = places,
        Err(refusal) => return Flow::Break(refusal.into()),
    }
    Flow::Continue(())
}

/// The body phase: the part of the body the app's WAF must see, read, inspected and held
/// to be sent on, then the whole body for the app's filters; `None` when nothing was held.
async fn body_phase(
    head: &mut http::request::Parts,
    incoming: &mut RequestBody,
    client: &Client,
    ctx: &mut RequestCtx,
    worker: &EventLoop,
    bytes_in: &Cell<usize>,
) -> Result<Option<Held>, Answer> {
    let buffers = ctx
        .route
        .as_ref()
        .is_some_and(|route| route.chain.runs(Stage::RequestBuffer));
    if buffers && !incoming.is_end_stream() {
        let shared = &worker.shared;
        let buffered = request_buffer::read_whole(
            head,
            incoming,
            ctx,
            &shared.request_buffers,
            shared.client_timeouts.body,
            bytes_in,
        );
        Box::pin(buffered)
            .await
            .inspect_err(|refusal| client.pacing.after(refusal))
            .map_err(Answer::from)?;
    }
    let held = match waf::policy_of(ctx) {
        Some(_) => inspected_body(head, incoming, client, ctx, worker, bytes_in).await?,
        None => None,
    };
    if ctx.filters.is_none() {
        return Ok(held);
    }
    let filtered = filters::on_request_body(head, incoming, held, ctx, worker, bytes_in);
    Box::pin(filtered)
        .await
        .map_err(|outcome| match filtered_flow(outcome) {
            Flow::Break(answer) => answer,
            Flow::Continue(()) => Refusal::upstream_failed(false).into(),
        })
}

/// The body the app's WAF inspected and holds.
async fn inspected_body(
    head: &http::request::Parts,
    incoming: &mut RequestBody,
    client: &Client,
    ctx: &mut RequestCtx,
    worker: &EventLoop,
    bytes_in: &Cell<usize>,
) -> Result<Option<Held>, Answer> {
    // The WAF, the cache and the images are awaited boxed, and only on the routes that
    // have them: their states (2.1, 4.4 and 1.5 KiB) would otherwise size this future,
    // which every request builds and moves whole (callgrind: memcpy, 4k instructions a
    // request before).
    let shared = &worker.shared;
    let inspected = Box::pin(waf::inspect::inspect(
        head,
        incoming,
        client.endpoints(),
        ctx,
        shared.waf.as_deref(),
        shared.client_timeouts.body,
        bytes_in,
    ));
    inspected
        .await
        .inspect_err(|refusal| client.pacing.after(refusal))
        .map_err(Answer::from)
}

/// The answers the router makes in place of the app's, by the stages of its chain that
/// make them: a file under the app's static root, a fresh copy from its cache, a resized
/// image (after the cache: one the app lets be cached is made once).
async fn answer_in_place_of_app(
    head: &http::request::Parts,
    client: &Client,
    ctx: &mut RequestCtx,
    worker: &EventLoop,
) -> Option<Answer> {
    let chain = ctx.route.as_ref()?.chain;
    for stage in chain.in_phase(Phase::InPlaceOfApp) {
        let answer = match stage {
            Stage::StaticFiles => static_files::find(ctx, &head.method, head.uri.path())
                .await
                .map(Answer::File),
            // The cache and the images are awaited boxed: their states (4.4 and 1.5 KiB)
            // would otherwise size this future on every route.
            Stage::Cache => Box::pin(fresh_copy(head, ctx, worker)).await,
            Stage::Images => Box::pin(resized_image(head, client, ctx, worker)).await,
            _ => None,
        };
        if answer.is_some() {
            return answer;
        }
    }
    None
}

/// A fresh copy from the app's cache, its background refresh started when it asks for one.
async fn fresh_copy(
    head: &http::request::Parts,
    ctx: &mut RequestCtx,
    worker: &EventLoop,
) -> Option<Answer> {
    if !cache::applies(ctx) {
        return None;
    }
    let shared = &worker.shared;
    let fresh = cache::request_phase(ctx, head, shared.cache_redis.as_ref()).await?;
    if let Some(refresh) = cache::take_background_refresh(ctx) {
        let pool = worker.cache_refreshes.clone();
        let connections = shared.connections.clone();
        tokio::task::spawn_local(cache::background::run(refresh, pool, connections));
    }
    Some(Answer::Cached(fresh))
}

/// The image the request asks for, resized on the worker pool.
async fn resized_image(
    head: &http::request::Parts,
    client: &Client,
    ctx: &mut RequestCtx,
    worker: &EventLoop,
) -> Option<Answer> {
    if !images::wants_resize(ctx, head) {
        return None;
    }
    let shared = &worker.shared;
    let resized = images::resize_for(
        shared.images.as_ref(),
        &shared.connections,
        ctx,
        head,
        Some(client.ip()),
    )
    .await?;
    let answer = image_answer(resized, &head.headers, ctx);
    if let Answer::Refused(refusal) = &answer {
        client.pacing.after(refusal);
    }
    Some(answer)
}

/// The upstream phase: a copy to the mirror, the request to a backend, and the response
/// phase's first decision (the cache's, on the app's answer head).
#[allow(clippy::too_many_arguments)]
async fn upstream_phase(
    head: &mut http::request::Parts,
    as_read: &Option<RequestFields>,
    unread: &mut Option<RequestBody>,
    held: Option<Held>,
    route: &AppRoute,
    client: &Client,
    ctx: &mut RequestCtx,
    worker: &EventLoop,
    bytes_in: Rc<Cell<usize>>,
) -> Answer {
    let Some(incoming) = unread.take() else {
        return Refusal::upstream_failed(false).into();
    };
    let client_version = head.version;
    let upgrade = Fields::of(&head.headers, as_read.as_ref()).contains(Known::Upgrade);
    let body_ended = incoming.is_end_stream();
    let chain = route.chain;
    let mut mirror_feed = None;
    for stage in chain.in_phase(Phase::UpstreamRequest) {
        match stage {
            Stage::Mirror if !upgrade => {
                let has_body = !body_ended || held.as_ref().is_some_and(|h| !h.data.is_empty());
                mirror_feed =
                    mirror::start_copy(&worker.mirrors, head, Some(client.ip()), has_body, ctx);
            }
            Stage::Cache => cache::upstream_request_phase(ctx, &mut head.headers),
            // The app's rules edit the head once it is the backend's (below).
            _ => {}
        }
    }
    let answer_form = if head.version < Version::HTTP_2 && !chain.reads_whole_answer {
        AnswerForm::AsRead
    } else {
        AnswerForm::Map
    };
    let request_rules = (route.header_rules.as_deref())
        .map(|rules| &rules.request)
        .filter(|edits| !edits.is_empty());
    let mut edits = RequestEdits::default();
    if as_read.is_some() {
        // In origin form, with no framing to rewrite and no cookies to join (`client_h1`);
        // the stages' edits are made as the backend's head is written.
        head.version = Version::HTTP_11;
        edits.rules = request_rules;
        if chain.runs(Stage::Compress) {
            edits.accept_encoding = Some(compress::accept_encoding(ctx));
        }
    } else {
        prepare_for_backend(head);
        if let Some(rules) = request_rules {
            rules.apply(&mut FieldsMut::map(&mut head.headers));
        }
    }
    let forwarding = Forwarding::new(
        Fields::of(&head.headers, as_read.as_ref()).get(Known::ForwardedFor),
        Some(client.ip()),
        client.forwarded_for.as_ref(),
        &ctx.hop(client_version),
    );
    let repeatable = head.method.is_idempotent() && body_ended && !upgrade;
    let replay = if repeatable { held.clone() } else { None };
    let body_deadline = worker.shared.client_timeouts.body;
    let client_failure = Rc::new(Cell::new(None));
    let mut body = Some(
        ForwardBody::new(incoming, body_deadline, bytes_in)
            .limited_to(route.app.limits.as_deref().and_then(|l| l.max_body_bytes))
            .after(held)
            .mirrored_into(mirror_feed)
            .failures_into(client_failure.clone()),
    );
    let outgoing = Outgoing {
        head,
        as_read: as_read.as_ref(),
        edits,
        forwarding: &forwarding,
        announced: (route.app.forwarding.proxy_protocol).map(|version| client.announced(version)),
        answer_form,
        repeatable,
        replay: replay.as_ref(),
        client_failure: &client_failure,
    };
    let mut response = match upstream::forward(worker, ctx, &outgoing, &mut body).await {
        Ok(response) => response,
        Err(refusal) => return refusal.into(),
    };
    // Backwards from the app: compression before the cache's decision (a copy is kept as
    // the client gets it, one per coding), a sticky cookie after it (a client's cookie is
    // never kept in a shared copy). The app's pages and its answer rules are the answer
    // writer's, on every answer. A route with a cache has its request's map.
    let status = response.status().as_u16();
    for stage in chain.in_phase(Phase::AnswerHead) {
        match stage {
            Stage::Compress => {
                // Fields as read are edited where they sit.
                let head_only = head.method == http::Method::HEAD;
                let mut as_read = response.body_mut().take_fields();
                let mut fields = FieldsMut::new(response.headers_mut(), as_read.as_mut());
                compress::prepare_answer(&route.app, ctx, status, head_only, &mut fields);
                response.body_mut().put_fields(as_read);
            }
            // A route with a cache has its answer's map.
            Stage::Cache => {
                let fields = response.headers_mut();
                if let Some(copy) = cache::response_phase(&head.headers, ctx, status, fields) {
                    return Answer::Cached(copy);
                }
            }
            Stage::Affinity => affinity::add_cookie(ctx),
            Stage::Filters => {
                let filtered = filters::on_answer_head(&mut response, ctx, worker);
                if let Flow::Break(answer) = filtered_flow(Box::pin(filtered).await) {
                    return answer;
                }
                let head_only = head.method == http::Method::HEAD;
                let read = filters::on_answer_body(&mut response, head_only, ctx, worker);
                if let Some(outcome) = Box::pin(read).await {
                    if let Flow::Break(answer) = filtered_flow(outcome) {
                        return answer;
                    }
                }
            }
            _ => {}
        }
    }
    Answer::Backend {
        response,
        read_deadline: upstream::read_deadline(ctx),
    }
}

/// An HTTP/2 request that declares an empty body but has not ended its stream is held until
/// it does: DATA that follows would make it malformed (RFC 9113 §8.1.1), and the backend's
/// answer must not reach the client first as if the request had been well formed. False
/// when the stream carried data, failed or did not end within `deadline`.
async fn empty_body_ends(incoming: &mut RequestBody, deadline: Duration) -> bool {
    loop {
        let next = std::future::poll_fn(|cx| Pin::new(&mut *incoming).poll_frame(cx));
        match tokio::time::timeout(deadline, next).await {
            Ok(None) => return true,
            Ok(Some(Ok(frame))) if frame.data_ref().is_some_and(Bytes::is_empty) => {}
            Ok(Some(Ok(frame))) if frame.is_trailers() => {}
            _ => return false,
        }
    }
}

/// The request head as the backend gets it: origin-form target, the Host routed on, one
/// framing. Hop-by-hop fields are left out, and the forwarding fields put in place of the
/// client's, as the head is written (`backend_h1`), not in the map.
fn prepare_for_backend(head: &mut http::request::Parts) {
    let headers = &mut head.headers;
    if let Some(authority) = head.uri.authority() {
        if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
            headers.insert(HOST, host);
        }
    }
    head.uri = head
        .uri
        .path_and_query()
        .map_or_else(|| Uri::from_static("/"), |p| Uri::from(p.clone()));
    if head.version >= Version::HTTP_2 {
        join_cookies(headers);
    }
    head.version = Version::HTTP_11;
    framing::normalise_for_backend(headers);
}

/// The answer to a request the app's password protection did not let through.
fn denied_answer(denied: basic_auth::Denied, client: &Client) -> Answer {
    match denied {
        basic_auth::Denied::Unauthorized(realm) => Answer::Unauthorized { realm },
        basic_auth::Denied::LockedOut(seconds) => {
            let refusal = Refusal::new(Reason::PasswordsLockedOut).come_back_in(seconds);
            client.pacing.after(&refusal);
            refusal.into()
        }
        basic_auth::Denied::Overloaded => Reason::PasswordCheckBusy.into(),
    }
}

/// HTTP/2 clients may split `Cookie` into one field per cookie; an HTTP/1.1 backend gets
/// them as the one field HTTP/1.1 allows (RFC 9113 §8.2.3).
fn join_cookies(headers: &mut HeaderMap) {
    let mut cookies = headers.get_all(COOKIE).iter();
    let (Some(first), Some(_)) = (cookies.next(), cookies.next()) else {
        return;
    };
    let mut joined = first.as_bytes().to_vec();
    for cookie in headers.get_all(COOKIE).iter().skip(1) {
        joined.extend_from_slice(b"; ");
        joined.extend_from_slice(cookie.as_bytes());
    }
    if let Ok(joined) = HeaderValue::from_bytes(&joined) {
        headers.insert(COOKIE, joined);
    }
}

/// The answer of the images stage; a resized image goes through the cache's decisions as
/// the app's own answers do.
fn image_answer(image: ImageAnswer, request_headers: &HeaderMap, ctx: &mut RequestCtx) -> Answer {
    let (content_type, body, cache_control) = match image {
        ImageAnswer::Refused(refusal) => return refusal.into(),
        ImageAnswer::Resized {
            content_type,
            body,
            cache_control,
        } => (content_type, body, cache_control),
    };
    let mut headers = HeaderMap::with_capacity(4);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    if let Some(value) = cache_control.and_then(|v| HeaderValue::try_from(v).ok()) {
        headers.insert(CACHE_CONTROL, value);
    }
    if let Some(label) = cache::keep_made_answer(request_headers, ctx, 200, &headers, &body) {
        headers.insert(X_CACHE, HeaderValue::from_static(label));
    }
    Answer::Made { headers, body }
}
