//! HTTP/3 (`--http3`): QUIC on one UDP socket (quinn), HTTP/3 over it (h3), TLS by rustls
//! with the certificates of the TLS listener (`crate::tls::quic`). Each request goes
//! through the same `crate::pipeline` as HTTP/1.1's and HTTP/2's, to the app's HTTP/1.1
//! backends, its body streamed both ways under the same deadlines and limits.
//!
//! The endpoint is driven by one listener thread (QUIC's connections are told apart by
//! their IDs, not by a socket per thread as TCP's are). What a client may hold is bounded:
//! streams per connection, the field section's size, QUIC's own flow-control windows, and
//! handshakes from addresses not proven yet (past [`MOST_UNPROVEN_HANDSHAKES`], a client is
//! asked to prove its address with a Retry first: a spoofed flood costs one packet each).
//! Cancelled requests need no count of their own, as HTTP/2's do (`h2_resets`): quinn gives
//! a stream's credit back only once this side of it has ended, so a client resetting the
//! requests it sent still has at most [`MAX_CONCURRENT_STREAMS`] under way.
//! QPACK's dynamic table is 0 (h3 decodes without one).
//!
//! 0-RTT (`--http3-early-data on`; off by default): a returning client may send requests
//! before its handshake ends, which an attacker can replay. A request whose stream opened
//! before the handshake ended is early: GET, HEAD and OPTIONS go to the app with
//! `Early-Data: 1` (RFC 8470, so the app may refuse what it would not repeat), any other
//! method is answered 425 Too Early and never forwarded.
//!
//! Stopping (shutdown, `--upgrade`): no new connection is taken, each connection sends
//! GOAWAY, and the requests under way finish within the shutdown grace. A router taking
//! over binds the port beside this one, and the kernel steers each packet to the router
//! whose connection it belongs to (`quic_steering`). Each connection's
//! round-trip time and lost packets are counted when it closes.

use std::cell::Cell;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use h3::error::Code;
use http::header::{CONTENT_LENGTH, TE, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, Request, Response, Version};
use http_body::Body;
use quinn::crypto::rustls::QuicServerConfig;
use tokio::sync::watch;

use super::connection::OpenConnection;
use super::quic_steering::{self, CidGeneration, GenerationCids};
use crate::event_loop::EventLoop;
use crate::metrics;
use crate::pipeline;
use crate::pipeline::answer_body::AnswerBody;
use crate::pipeline::client::Client;
use crate::request_body::{H3Body, RequestBody};
use crate::respond::Reason;
use crate::tls::cert_cache::CertCache;

/// Requests one connection may have open at once (HTTP/2's limit, `h2.rs`).
const MAX_CONCURRENT_STREAMS: u32 = 128;
/// The largest field section a request may have (HTTP/2's, `h2.rs`).
const MAX_FIELD_SECTION: u64 = 64 * 1024;
/// Handshakes under way from addresses QUIC has not validated, past which new clients are
/// sent a Retry (their address proved by echoing its token) before any state is kept.
const MOST_UNPROVEN_HANDSHAKES: usize = 64;
/// Longest the listener waits for the certificates to load before its first handshake.
const MOST_WARMING: Duration = Duration::from_secs(10);
/// Connections waiting for the thread to take them; more are refused.
const MAX_INCOMING: usize = 4096;

/// RFC 8470's field: the request came (at least partly) in early data.
const EARLY_DATA: HeaderName = HeaderName::from_static("early-data");

/// Fields that name the connection, which HTTP/3 has none of: a request carrying one is
/// malformed (RFC 9114 §4.2), and none goes into an answer.
const CONNECTION_FIELDS: [&str; 4] = ["connection", "keep-alive", "proxy-connection", "upgrade"];

/// The UDP socket and TLS of the HTTP/3 listener, made before the threads start so that a
/// taken address is an error at start-up.
pub(super) struct Http3Socket {
    pub(super) socket: std::net::UdpSocket,
    pub(super) tls: Arc<QuicServerConfig>,
    /// The certificates `tls` chooses from, loaded before the first handshake.
    pub(super) certs: Arc<CertCache>,
    /// What the connection IDs this router issues start with.
    pub(super) generation: CidGeneration,
    /// 0-RTT taken (for safe methods).
    pub(super) early_data: bool,
}

impl Http3Socket {
    /// Binds `address`, beside the socket of the router this one takes over from when
    /// there is one (`predecessor`: the generation of its connection IDs), whose
    /// connections' packets go on reaching it.
    pub(super) fn bind(
        address: SocketAddr,
        certs: Arc<CertCache>,
        predecessor: Option<CidGeneration>,
        early_data: bool,
    ) -> std::io::Result<Self> {
        let tls = crate::tls::quic::server_config(certs.clone(), early_data)
            .map_err(std::io::Error::other)?;
        let tls = QuicServerConfig::try_from(tls).map_err(std::io::Error::other)?;
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(address),
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )?;
        socket.set_reuse_port(true)?;
        socket.bind(&address.into())?;
        if let Some(predecessor) = predecessor {
            match quic_steering::steer_by_generation(&socket, predecessor) {
                Ok(()) => log::info!(
                    "http/3 packets of connection IDs of generation {} go on reaching the router taken over from",
                    predecessor.0
                ),
                // Unsteered, the kernel spreads packets by address: some of the old
                // router's connections reach this one and are reset (clients reconnect).
                Err(e) => log::warn!(
                    "http/3 packets not steered between the routers on {address}: {e}"
                ),
            }
        }
        let socket = std::net::UdpSocket::from(socket);
        Ok(Self {
            socket,
            tls: Arc::new(tls),
            certs,
            generation: CidGeneration::after(predecessor),
            early_data,
        })
    }
}

/// Serves HTTP/3 on `socket` until the listener stops and the connections have finished.
pub(super) async fn serve(
    socket: Http3Socket,
    worker: Rc<EventLoop>,
    mut stopped: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let reached = socket.socket.local_addr()?;
    // Clients' first packets wait in the socket's buffer meanwhile (or are sent again).
    let started = std::time::Instant::now();
    match tokio::time::timeout(MOST_WARMING, socket.certs.warm()).await {
        Ok(Ok(loaded)) => log::info!(
            "http/3: {loaded} certificates loaded in {} ms",
            started.elapsed().as_millis()
        ),
        Ok(Err(e)) => log::warn!("http/3: certificates not loaded ahead ({e}): each name's first handshake fails"),
        Err(_) => log::warn!("http/3: certificates still loading after {MOST_WARMING:?}: the rest load as names are asked for"),
    }
    let timeouts = worker.shared.client_timeouts;
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(MAX_CONCURRENT_STREAMS.into())
        // The client's control and QPACK streams; h3 opens no others.
        .max_concurrent_uni_streams(3u32.into())
        .max_idle_timeout(quinn::IdleTimeout::try_from(timeouts.idle).ok());
    let mut config = quinn::ServerConfig::with_crypto(socket.tls);
    config
        .transport_config(Arc::new(transport))
        .max_incoming(MAX_INCOMING);
    let generation = socket.generation;
    let mut endpoint_config = quinn::EndpointConfig::default();
    endpoint_config.cid_generator(move || Box::new(GenerationCids(generation)));
    let endpoint = quinn::Endpoint::new(
        endpoint_config,
        Some(config),
        socket.socket,
        Arc::new(quinn::TokioRuntime),
    )?;
    log::info!("listener serving http/3 on {reached}");
    let unproven = Rc::new(Cell::new(0usize));
    loop {
        let incoming = tokio::select! {
            incoming = endpoint.accept() => incoming,
            _ = stopped.changed() => break,
        };
        let Some(incoming) = incoming else { break };
        if !incoming.remote_address_validated() && unproven.get() >= MOST_UNPROVEN_HANDSHAKES {
            metrics::QUIC_HANDSHAKES
                .with_label_values(&["retried"])
                .inc();
            let _ = incoming.retry();
            continue;
        }
        let handshake = Handshake::count(&unproven, !incoming.remote_address_validated());
        crate::traffic::cost::spawn_connection(connection(
            incoming,
            handshake,
            reached,
            socket.early_data,
            worker.clone(),
            stopped.clone(),
        ));
    }
    // New connections are refused from here; open ones finish (each has sent GOAWAY).
    endpoint.set_server_config(None);
    while worker.open_connections.get() > 0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    endpoint.close(quinn::VarInt::from_u32(0x100), b"");
    Ok(())
}

/// A handshake under way from an address not validated yet, counted while it lasts.
struct Handshake(Option<Rc<Cell<usize>>>);

impl Handshake {
    fn count(unproven: &Rc<Cell<usize>>, counted: bool) -> Self {
        if !counted {
            return Self(None);
        }
        unproven.set(unproven.get() + 1);
        Self(Some(unproven.clone()))
    }
}

impl Drop for Handshake {
    fn drop(&mut self) {
        if let Some(unproven) = &self.0 {
            unproven.set(unproven.get().saturating_sub(1));
        }
    }
}

/// Counts a connection's round-trip time and packets, sent and lost, when it ends.
struct PathFigures(quinn::Connection);

impl Drop for PathFigures {
    fn drop(&mut self) {
        let path = self.0.stats().path;
        metrics::QUIC_RTT.observe(self.0.rtt().as_secs_f64());
        metrics::QUIC_PACKETS
            .with_label_values(&["sent"])
            .inc_by(path.sent_packets);
        metrics::QUIC_PACKETS
            .with_label_values(&["lost"])
            .inc_by(path.lost_packets);
    }
}

async fn connection(
    incoming: quinn::Incoming,
    handshake: Handshake,
    reached: SocketAddr,
    early_data: bool,
    worker: Rc<EventLoop>,
    mut stopped: watch::Receiver<bool>,
) {
    let _open = OpenConnection::count(&worker);
    let peer = incoming.remote_address();
    let connecting = match incoming.accept() {
        Ok(connecting) => connecting,
        Err(e) => {
            metrics::QUIC_HANDSHAKES
                .with_label_values(&["failed"])
                .inc();
            log::debug!("listener: QUIC connection from {peer} refused: {e}");
            return;
        }
    };
    let header = worker.shared.client_timeouts.header;
    // With 0-RTT on, the connection is taken before its handshake ends: a client's early
    // requests arrive meanwhile.
    let taken_early = if early_data {
        connecting.into_0rtt()
    } else {
        Err(connecting)
    };
    let (quic, early) = match taken_early {
        Ok((quic, handshake_done)) => {
            let early = Rc::new(EarlyRequests::default());
            crate::traffic::cost::spawn_for_connection(finish_handshake(
                quic.clone(),
                handshake_done,
                handshake,
                early.clone(),
                header,
            ));
            (quic, Some(early))
        }
        Err(connecting) => {
            let Some(quic) = handshake_within(connecting, header, peer).await else {
                return;
            };
            drop(handshake);
            (quic, None)
        }
    };
    let _quic_open = metrics::Held::on(&metrics::QUIC_CONNECTIONS);
    let _path = PathFigures(quic.clone());
    let built = h3::server::builder()
        .max_field_section_size(MAX_FIELD_SECTION)
        .build::<_, Bytes>(h3_quinn::Connection::new(quic))
        .await;
    let mut h3 = match built {
        Ok(h3) => h3,
        Err(e) => {
            log::debug!("listener: HTTP/3 with {peer} not set up: {e}");
            return;
        }
    };
    let client = Client::new(peer, reached, true);
    let mut going_away = *stopped.borrow();
    if going_away {
        let _ = h3.shutdown(0).await;
    }
    loop {
        let accepted = tokio::select! {
            accepted = h3.accept() => accepted,
            changed = stopped.changed(), if !going_away => {
                going_away = true;
                if changed.is_ok() {
                    // GOAWAY: the requests under way finish, no new one is taken.
                    let _ = h3.shutdown(0).await;
                }
                continue;
            }
        };
        match accepted {
            Ok(Some(resolver)) => {
                // Its stream opened before the handshake ended: 0-RTT data.
                let is_early = early.as_ref().is_some_and(|early| early.taken());
                crate::traffic::cost::spawn_stream(request(
                    resolver,
                    is_early,
                    client.clone(),
                    worker.clone(),
                ));
            }
            Ok(None) => break,
            Err(e) => {
                log::debug!("listener: HTTP/3 connection from {peer} ended: {e}");
                break;
            }
        }
    }
}

/// The handshake of `connecting`, within `deadline`; counted either way.
async fn handshake_within(
    connecting: quinn::Connecting,
    deadline: Duration,
    peer: SocketAddr,
) -> Option<quinn::Connection> {
    let result = match tokio::time::timeout(deadline, connecting).await {
        Ok(Ok(quic)) => Some(quic),
        Ok(Err(e)) => {
            log::debug!("listener: QUIC handshake with {peer} failed: {e}");
            None
        }
        Err(_) => None,
    };
    let outcome = if result.is_some() {
        "completed"
    } else {
        "failed"
    };
    metrics::QUIC_HANDSHAKES.with_label_values(&[outcome]).inc();
    result
}

/// A connection taken before its handshake ended (0-RTT): whether it still is, and how
/// many requests came before it ended.
#[derive(Default)]
struct EarlyRequests {
    handshake_done: Cell<bool>,
    taken: Cell<u32>,
}

impl EarlyRequests {
    /// Counts a request the connection has, and tells whether it came before the handshake
    /// ended.
    fn taken(&self) -> bool {
        if self.handshake_done.get() {
            return false;
        }
        self.taken.set(self.taken.get().saturating_add(1));
        true
    }
}

/// Waits for the end of a handshake the connection was taken before (0-RTT), within
/// `deadline`: counts it, and from then on the connection's new requests are not early.
/// (quinn's `ZeroRttAccepted` tells a server nothing: it answers for clients only.)
async fn finish_handshake(
    quic: quinn::Connection,
    handshake_done: quinn::ZeroRttAccepted,
    handshake: Handshake,
    early: Rc<EarlyRequests>,
    deadline: Duration,
) {
    let ended = tokio::time::timeout(deadline, handshake_done).await;
    drop(handshake);
    early.handshake_done.set(true);
    // A client answered in 0.5-RTT data may close before its handshake ends: its early
    // requests were taken all the same.
    let early_data = if early.taken.get() > 0 {
        "accepted"
    } else {
        "not_taken"
    };
    metrics::QUIC_EARLY_DATA
        .with_label_values(&[early_data])
        .inc();
    let completed = ended.is_ok() && quic.close_reason().is_none();
    let outcome = if completed { "completed" } else { "failed" };
    metrics::QUIC_HANDSHAKES.with_label_values(&[outcome]).inc();
    if ended.is_err() {
        quic.close(quinn::VarInt::from_u32(0x100), b"handshake timeout");
    }
}

/// Methods a request sent in 0-RTT data may have: safe ones (RFC 9110 §9.2.1), which the
/// app should not mind seeing twice.
fn safe_early(method: &http::Method) -> bool {
    matches!(
        *method,
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
    )
}

/// RFC 8470's answer to an unsafe request sent in early data: the client sends it again
/// once its handshake is done.
fn too_early() -> Response<AnswerBody> {
    let mut response = pipeline::before_request(Reason::TooEarly);
    let length = http::HeaderValue::from(response.body().len());
    response.headers_mut().insert(CONTENT_LENGTH, length);
    response.map(|text| AnswerBody::local(text, None))
}

type Resolver = h3::server::RequestResolver<h3_quinn::Connection, Bytes>;

async fn request(resolver: Resolver, early: bool, client: Rc<Client>, worker: Rc<EventLoop>) {
    let (head, stream) = match resolver.resolve_request().await {
        Ok(resolved) => resolved,
        Err(e) => {
            log::debug!("listener: HTTP/3 request not read: {e}");
            return;
        }
    };
    metrics::HTTP3_REQUESTS.inc();
    let (mut send, receive) = stream.split();
    let (mut parts, ()) = head.into_parts();
    parts.version = Version::HTTP_3;
    let Some(declared) = well_formed(&parts.headers) else {
        // Malformed (RFC 9114 §4.1.2): a stream error, never a request to the app.
        send.stop_stream(Code::H3_MESSAGE_ERROR);
        return;
    };
    let response = if early && !safe_early(&parts.method) {
        metrics::HTTP3_EARLY_REQUESTS
            .with_label_values(&["too_early"])
            .inc();
        too_early()
    } else {
        if early {
            metrics::HTTP3_EARLY_REQUESTS
                .with_label_values(&["forwarded"])
                .inc();
            parts
                .headers
                .insert(EARLY_DATA, http::HeaderValue::from_static("1"));
        }
        let body = RequestBody::H3(Box::new(H3Body::new(receive, declared)));
        let request = Request::from_parts(parts, body);
        pipeline::handle(request, None, client, worker.clone(), None).await
    };
    let (mut parts, mut body) = response.into_parts();
    for name in CONNECTION_FIELDS {
        parts.headers.remove(name);
    }
    parts.headers.remove(TRANSFER_ENCODING);
    let send_within = worker.shared.client_timeouts.send;
    if send
        .send_response(Response::from_parts(parts, ()))
        .await
        .is_err()
    {
        return;
    }
    loop {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        let sent = match frame {
            None => break,
            Some(Err(e)) => {
                log::debug!("listener: HTTP/3 answer broke off: {e}");
                send.stop_stream(Code::H3_INTERNAL_ERROR);
                return;
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => tokio::time::timeout(send_within, send.send_data(data)).await,
                Err(frame) => match frame.into_trailers() {
                    Ok(trailers) => {
                        tokio::time::timeout(send_within, send.send_trailers(trailers)).await
                    }
                    Err(_) => continue,
                },
            },
        };
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                log::debug!("listener: HTTP/3 client stopped reading: {e}");
                return;
            }
            Err(_) => {
                // A client that takes nothing for the send deadline holds no more of ours.
                send.stop_stream(Code::H3_REQUEST_CANCELLED);
                return;
            }
        }
    }
    let _ = send.finish().await;
}

/// The Content-Length a request declares (`Some(None)`: none), or `None` when the request
/// is malformed for HTTP/3: a field naming the connection, a `TE` other than `trailers`, a
/// `Transfer-Encoding`, or a Content-Length that is not one number.
fn well_formed(fields: &HeaderMap) -> Option<Option<u64>> {
    if CONNECTION_FIELDS
        .iter()
        .any(|name| fields.contains_key(HeaderName::from_static(name)))
        || fields.contains_key(TRANSFER_ENCODING)
    {
        return None;
    }
    if fields
        .get_all(TE)
        .iter()
        .any(|te| !te.as_bytes().eq_ignore_ascii_case(b"trailers"))
    {
        return None;
    }
    let mut lengths = fields.get_all(CONTENT_LENGTH).iter();
    let Some(first) = lengths.next() else {
        return Some(None);
    };
    let length = std::str::from_utf8(first.as_bytes()).ok()?;
    if lengths.next().is_some() || length.is_empty() || !length.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    length.parse().ok().map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(n, v)| {
                (
                    HeaderName::from_bytes(n.as_bytes()).expect("a name"),
                    v.parse().expect("a value"),
                )
            })
            .collect()
    }

    #[test]
    fn connection_fields_and_odd_lengths_make_a_request_malformed() {
        assert_eq!(well_formed(&fields(&[])), Some(None));
        assert_eq!(
            well_formed(&fields(&[("content-length", "12")])),
            Some(Some(12))
        );
        assert_eq!(well_formed(&fields(&[("te", "trailers")])), Some(None));
        for malformed in [
            &[("connection", "close")][..],
            &[("keep-alive", "5")],
            &[("transfer-encoding", "chunked")],
            &[("upgrade", "websocket")],
            &[("te", "gzip")],
            &[("content-length", "1"), ("content-length", "1")],
            &[("content-length", "-1")],
            &[("content-length", "1 2")],
        ] {
            assert_eq!(well_formed(&fields(malformed)), None, "{malformed:?}");
        }
    }
}
