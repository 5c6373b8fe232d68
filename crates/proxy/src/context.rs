//! The per-request state shared by every stage, created when a request arrives and dropped
//! when its connection is done with it (which releases the backend's in-flight count and
//! connection registration).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::HeaderValue;
use smallvec::SmallVec;

use crate::content_coding::{Coding, Encoder};
use crate::forwarded::Hop;
use crate::isolation::fair_share::Turn;
use crate::isolation::RequestWeight;
use crate::metrics;
use crate::respond::Reason;
use crate::routing::affinity_tokens::Sticky;
use crate::routing::balancer::InFlight;
use crate::routing::connections::ConnectionTicket;
use crate::routing::route_cache::AppRoute;
use crate::stage::cache::state::CacheCtx;
use crate::stage::limits::Places;
use crate::traffic::app_requests::{AppRequests, REQUEST_COUNTS};
use crate::traffic::cost::{self, RequestCpu};

thread_local! {
    /// The id of a request not given its own yet: shared, so that making a context
    /// allocates none.
    static NO_REQUEST_ID: Arc<str> = Arc::from("");
}

/// What the stages know about one request.
#[derive(Debug)]
pub(crate) struct RequestCtx {
    /// When the request was first seen.
    pub(crate) started: Instant,
    /// The same moment by the wall clock, for `X-Request-Start`: read once here rather
    /// than worked out from the monotonic clock when the request is forwarded (two reads).
    pub(crate) started_wall: SystemTime,
    /// Id passed to the backend and written in the access log.
    pub(crate) request_id: Arc<str>,
    /// Whether the client connection is TLS.
    pub(crate) tls: bool,
    /// The port the client connected to.
    pub(crate) server_port: u16,
    /// What the client's sticky-session cookie says (`stage::affinity`).
    pub(crate) sticky: Option<Box<Sticky>>,
    /// The sticky-session cookie the app's answer gets (`stage::affinity`): added to the
    /// app's own `Set-Cookie` fields by whichever writer writes the answer, with or
    /// without a map of them.
    pub(crate) sticky_cookie: Option<HeaderValue>,
    /// The coding this client's answers are compressed with, for an app that compresses.
    pub(crate) coding: Option<Coding>,
    /// The encoder of this answer's body, once its head was made compressed.
    pub(crate) encoder: Option<Box<Encoder>>,
    /// Whether the client takes the app's HTML pages (`stage::app_pages`).
    pub(crate) wants_html: bool,
    /// The body length the request's Content-Length declares, as the framing stage read it;
    /// `None` for a chunked body or none.
    pub(crate) declared_length: Option<u64>,
    /// The normalised Host, when it had one.
    pub(crate) host: Option<String>,
    /// The app the Host resolved to.
    pub(crate) route: Option<Arc<AppRoute>>,
    /// Backends already attempted, in order.
    pub(crate) tried: SmallVec<[SocketAddr; 2]>,
    /// The backend of the current attempt, counted as in flight.
    pub(crate) backend: Option<InFlight>,
    /// The upstream socket of the current attempt in the connection table, for draining.
    pub(crate) upstream_connection: Option<ConnectionTicket>,
    /// When the current attempt started connecting.
    pub(crate) attempt_started: Option<Instant>,
    /// Time from the successful attempt's start to the response header.
    pub(crate) upstream_time: Option<Duration>,
    /// Whether the response switched protocols (WebSocket or another upgrade).
    pub(crate) upgraded: bool,
    /// Why the router answered itself instead of the app, for the access log.
    pub(crate) refused: Option<Reason>,
    /// The response cache's state, for apps that cache.
    pub(crate) cache: Option<Box<CacheCtx>>,
    /// Its places among the app's and its client's requests in flight, held until the
    /// answer ends (a WebSocket's until it closes).
    pub(crate) limit_places: Places,
    /// Light or heavy, and how long it was held (`crate::isolation`).
    pub(crate) weight: RequestWeight,
    /// Its place among the requests of apps over their CPU share on its event loop, held
    /// until it ends (`isolation::fair_share`).
    pub(crate) fair_turn: Option<Turn>,
    /// Counted in the active-requests gauge until dropped.
    _active: metrics::Held,
    /// The request's contexts in its app's proxy-wasm filters, once they are made; when
    /// dropped (the request done), their `on_log` runs.
    pub(crate) filters: Option<Box<switchyard_filters::RequestFilters>>,
    /// Its place in its task's CPU measure (the access log's `cpu_us`).
    pub(crate) cpu: RequestCpu,
    /// The app whose in-flight requests (and WebSockets) count it, from routing on.
    pub(crate) charged: Option<Arc<AppRequests>>,
}

impl RequestCtx {
    /// State for a newly arrived request.
    pub(crate) fn new() -> Self {
        Self {
            started: Instant::now(),
            started_wall: SystemTime::now(),
            request_id: NO_REQUEST_ID.with(Arc::clone),
            tls: false,
            server_port: 0,
            wants_html: false,
            coding: None,
            encoder: None,
            sticky: None,
            sticky_cookie: None,
            declared_length: None,
            host: None,
            route: None,
            tried: SmallVec::new(),
            backend: None,
            upstream_connection: None,
            attempt_started: None,
            upstream_time: None,
            upgraded: false,
            refused: None,
            cache: None,
            limit_places: Places::default(),
            weight: RequestWeight::default(),
            fair_turn: None,
            filters: None,
            cpu: cost::request_started(),
            charged: None,
            _active: metrics::Held::on(&metrics::ACTIVE_REQUESTS),
        }
    }

    /// What the forwarding fields of this request, which came in `version`, are made of.
    pub(crate) fn hop(&self, version: http::Version) -> Hop<'_> {
        let wants_host = self
            .route
            .as_ref()
            .is_some_and(|route| route.app.forwarding.x_forwarded_host);
        Hop {
            tls: self.tls,
            request_id: &self.request_id,
            server_port: self.server_port,
            started: self.started_wall,
            version,
            forwarded_host: self
                .host
                .as_deref()
                .filter(|_| wants_host)
                .map(str::as_bytes),
        }
    }

    /// The app's name, or "" before routing / for unknown hosts.
    pub(crate) fn app_name(&self) -> &str {
        self.route.as_ref().map_or("", |r| r.app.name.as_str())
    }

    /// Counts the request, answered with `status` (0 when nothing was sent), in its app's
    /// requests and, unless it was upgraded (a WebSocket, whose lifetime is no answer
    /// time: hours of it would be every p99), in the duration histograms.
    /// The request is `app`'s from now on: its polls and its place in flight are charged
    /// there (stage `route`).
    pub(crate) fn charge_to(&mut self, app: &Arc<AppRequests>) {
        cost::charge_to(app);
        if self.charged.is_none() {
            app.cost.in_flight.fetch_add(1, Ordering::Relaxed);
            self.charged = Some(app.clone());
        }
    }

    pub(crate) fn count_answer(&self, status: u16) {
        let answer_time = (!self.upgraded).then(|| self.started.elapsed());
        match &self.route {
            Some(route) => route.requests.record(status, answer_time),
            None => REQUEST_COUNTS.unrouted().record(status, answer_time),
        }
        if let Some(took) = answer_time {
            metrics::REQUEST_DURATION_BY_CLASS[metrics::status_class_index(status)]
                .observe(took.as_secs_f64());
        }
    }

    /// Ends the current attempt's bookkeeping (in-flight count, connection registration).
    pub(crate) fn release_attempt(&mut self) {
        self.upstream_connection = None;
        self.backend = None;
    }
}

impl Default for RequestCtx {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for RequestCtx {
    fn drop(&mut self) {
        self.release_attempt();
        if self.upgraded {
            metrics::OPEN_WEBSOCKETS.dec();
        }
        if let Some(app) = &self.charged {
            app.cost.in_flight.fetch_sub(1, Ordering::Relaxed);
            if self.upgraded {
                app.cost.websockets.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}
