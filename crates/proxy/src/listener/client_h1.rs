//! HTTP/1.x from clients, on the router's own codec (`crates/h1`), as nginx, HAProxy and
//! Sozu speak to theirs: one task per connection reads a head into the connection's buffer,
//! parses it in place, serves the request through the stages (`pipeline::handle`) with its
//! body read by the same task from the same buffer, and writes the answer's head and its
//! first piece in one write. Requests are answered in the order they came (pipelining), one
//! timer per connection bounds the wait for each head, and the buffers of a connection idle
//! between requests are given back.
//!
//! What `crates/h1` refuses never reaches a stage: a malformed head, more than 100 lines or
//! 64 KiB of head, ambiguous framing (tests/smuggling.rs) get 400 or 431 and the connection
//! closes after it.

use std::cell::RefCell;
use std::future::poll_fn;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body::{Body, Frame};
use switchyard_h1::{
    header_slots, parse_request, AnswerConnection, AnswerFields, AnswerFraming, ChunkedReframer,
    MAX_HEADERS, MAX_HEAD_BYTES,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

use super::clock::Deadline;
use super::connection::Connection;
use super::read_buffers;
use super::relay::{ClientSide, IntoClientSide};
use super::send_deadline::SendDeadline;
use crate::metrics;
use crate::pipeline::answer_body::AnswerBody;
use crate::pipeline::client::Client;
use crate::pipeline::{self, RouterFields};
use crate::request_body::{ConnectionBody, PeerError, RequestBody};
use crate::request_fields::{KnownFields, RequestFields};
use crate::respond::Reason;

/// Bytes read at once for a head or a body.
const READ_PIECE: usize = 16 * 1024;

/// Most bytes of a connection's first read after it waited: a request head, usually whole.
const FIRST_READ: usize = 4096;

/// Most bytes read while a request is served with its body read: the next request, early.
const CLIENT_GONE_PROBE: usize = 1024;

/// An answer's pieces up to this size are copied behind its head (or the pieces before
/// them) so that one write carries them; larger ones are written from where they are.
const COALESCE_BELOW: usize = 16 * 1024;

/// Largest write buffer a connection keeps between requests: most answers' heads and
/// small bodies fit, and an idle connection holds no more.
const IDLE_WRITE_BUFFER: usize = 2048;

/// The interim answer to `Expect: 100-continue`, sent when the request's body is first
/// read: a request refused before (a 404, a 413) is answered without the client sending
/// its body.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// After a refused head, how long the router reads and drops what the client still sends
/// before closing, so that its close does not reset the connection under the answer.
const REFUSAL_LINGER: Duration = Duration::from_secs(2);

/// Most bytes dropped so after a refused head.
const REFUSAL_LINGER_BYTES: usize = 1024 * 1024;

/// What is left of the body of the request being served.
enum BodyLeft {
    /// Read to its end, or none.
    Done,
    /// This many bytes.
    Length(u64),
    /// A chunked body, read to its data.
    Chunked(Box<ChunkedReframer>),
    /// The body broke or the connection closed under it: nothing more is read.
    Broken,
}

/// The client's side of the connection: its socket, what was read and not yet used, and
/// where the current request's body stands. Shared by the driver and the request's body,
/// each borrowing it only within one poll.
struct Inbound<S> {
    stream: SendDeadline<S>,
    read: BytesMut,
    body: BodyLeft,
    /// `100 Continue` is owed before the body is read: how much of it has been written.
    continue_owed: Option<usize>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Inbound<S> {
    /// Reads more into the buffer; the bytes read, 0 when the client closed.
    fn poll_read_more(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        if self.read.capacity() == 0 {
            // A connection waiting between requests holds no buffer: the first bytes land
            // on the stack, and one is taken once they have come. Reserved while waiting, a
            // buffer cost each idle connection a resident page (7.6 KiB per connection
            // measured, 2.9 of them the task's own).
            return self.poll_read_via_stack::<FIRST_READ>(cx, READ_PIECE);
        }
        if self.read.capacity() - self.read.len() < READ_PIECE / 4 {
            self.read.reserve(READ_PIECE);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.read)
    }

    /// Reads at most `N` bytes into a buffer on the stack and appends them to the read
    /// buffer, reserving `room` there first when any came; the bytes read, 0 when the
    /// client closed. For reads that must not reserve a buffer before bytes come.
    fn poll_read_via_stack<const N: usize>(
        &mut self,
        cx: &mut Context<'_>,
        room: usize,
    ) -> Poll<std::io::Result<usize>> {
        // Uninitialised: zeroing it would cost more than the read (8k instructions).
        let mut landing = [const { MaybeUninit::<u8>::uninit() }; N];
        let mut landing = ReadBuf::uninit(&mut landing);
        ready!(Pin::new(&mut self.stream).poll_read(cx, &mut landing))?;
        let read = landing.filled().len();
        if read > 0 {
            if self.read.capacity() == 0 {
                self.read = read_buffers::take(room.max(read));
            } else {
                self.read.reserve(room.max(read));
            }
            self.read.extend_from_slice(landing.filled());
        }
        Poll::Ready(Ok(read))
    }

    fn poll_continue(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), PeerError>> {
        let Some(mut written) = self.continue_owed else {
            return Poll::Ready(Ok(()));
        };
        while written < CONTINUE.len() {
            match Pin::new(&mut self.stream).poll_write(cx, &CONTINUE[written..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(PeerError::Closed)),
                Poll::Ready(Ok(n)) => written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(PeerError::Io(e))),
                Poll::Pending => {
                    self.continue_owed = Some(written);
                    return Poll::Pending;
                }
            }
        }
        self.continue_owed = Some(written);
        match Pin::new(&mut self.stream).poll_flush(cx) {
            Poll::Ready(Ok(())) => {
                self.continue_owed = None;
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(PeerError::Io(e))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_body_piece(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, PeerError>>> {
        if matches!(self.body, BodyLeft::Done) {
            return Poll::Ready(None);
        }
        match self.poll_continue(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(self.broken(e)))),
            Poll::Pending => return Poll::Pending,
        }
        loop {
            match &mut self.body {
                BodyLeft::Done => return Poll::Ready(None),
                BodyLeft::Broken => return Poll::Ready(Some(Err(PeerError::Closed))),
                BodyLeft::Length(left) if !self.read.is_empty() => {
                    let take = usize::try_from(*left)
                        .map_or(self.read.len(), |left| left.min(self.read.len()));
                    *left -= take as u64;
                    if *left == 0 {
                        self.body = BodyLeft::Done;
                    }
                    return Poll::Ready(Some(Ok(self.read.split_to(take).freeze())));
                }
                BodyLeft::Chunked(reframer) if !self.read.is_empty() => {
                    let mut data = Vec::new();
                    match reframer.reframe(&self.read, &mut data) {
                        Ok(reframed) => {
                            self.read.advance(reframed.consumed);
                            if reframed.done {
                                self.body = BodyLeft::Done;
                            }
                            if !data.is_empty() {
                                return Poll::Ready(Some(Ok(Bytes::from(data))));
                            }
                            if reframed.done {
                                return Poll::Ready(None);
                            }
                        }
                        Err(e) => {
                            return Poll::Ready(Some(Err(self.broken(PeerError::Chunked(e)))))
                        }
                    }
                }
                BodyLeft::Length(_) | BodyLeft::Chunked(_) => {}
            }
            match self.poll_read_more(cx) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Some(Err(self.broken(PeerError::Closed))))
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => {
                    return Poll::Ready(Some(Err(self.broken(PeerError::Io(e)))))
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn broken(&mut self, error: PeerError) -> PeerError {
        self.body = BodyLeft::Broken;
        error
    }

    /// While a request is served with its body read, looks for the client closing (its
    /// request is then dropped, the backend's exchange with it) or sending the next
    /// request early (kept for its turn). Pending for as long as neither happens.
    fn poll_client_gone(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        if !matches!(self.body, BodyLeft::Done) || !self.read.is_empty() {
            return Poll::Pending;
        }
        // Not into the read buffer's spare room: the request's head still shares it.
        match self.poll_read_via_stack::<CLIENT_GONE_PROBE>(cx, 0) {
            Poll::Ready(Ok(0) | Err(_)) => Poll::Ready(true),
            Poll::Ready(Ok(_)) | Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> ConnectionBody for RefCell<Inbound<S>> {
    fn poll_piece(&self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, PeerError>>> {
        match self.try_borrow_mut() {
            Ok(mut inbound) => inbound.poll_body_piece(cx),
            // Never while a poll of the driver's holds it (both run on one task, one poll
            // at a time); an error rather than a panic all the same.
            Err(_) => Poll::Ready(Some(Err(PeerError::Closed))),
        }
    }

    fn ended(&self) -> bool {
        self.try_borrow()
            .is_ok_and(|inbound| matches!(inbound.body, BodyLeft::Done))
    }

    fn left(&self) -> Option<u64> {
        match self.try_borrow().ok()?.body {
            BodyLeft::Done => Some(0),
            BodyLeft::Length(left) => Some(left),
            BodyLeft::Chunked(_) | BodyLeft::Broken => None,
        }
    }
}

/// What the driver keeps of a request's head once the stages have it.
struct HeadFacts {
    minor_version: u8,
    keeps_connection: bool,
    is_head: bool,
}

/// What became of reading a head. Moved once per request: boxing the request would cost
/// every request an allocation to save a copy.
#[allow(clippy::large_enum_variant)]
enum HeadRead {
    Request(Request<RequestBody>, Option<RequestFields>, HeadFacts),
    /// Refused: answer as this reason's row says, and close.
    Refused(Reason),
    /// The client closed, the wait ran out, or the router is stopping: close.
    Close,
}

/// Serves HTTP/1.x on `stream` until the client or the router closes. The first head must
/// be in before `deadline` passes; each later one within the idle timeout of the previous
/// answer's end, on the same deadline.
pub(super) async fn serve<S>(mut connection: Connection, stream: S, tls: bool, deadline: Deadline)
where
    S: AsyncRead + AsyncWrite + Unpin + IntoClientSide + 'static,
{
    let worker = connection.worker.clone();
    let timeouts = worker.shared.client_timeouts;
    let inbound = Rc::new(RefCell::new(Inbound {
        stream: SendDeadline::new(stream, timeouts.send),
        read: BytesMut::new(),
        body: BodyLeft::Done,
        continue_owed: None,
    }));
    let client = Client::new(connection.peer, connection.reached, tls);
    // One deadline for the connection's life: the first head's, then each idle timeout's.
    let mut served = 0u64;
    let mut write = Vec::new();
    // Made once for the connection (not at each wait for a head), and looked at only until
    // it has fired.
    let stop = connection.stopped.changed();
    tokio::pin!(stop);
    loop {
        let (request, as_read, facts) =
            match read_head(&inbound, stop.as_mut(), &client, &deadline, served).await {
                HeadRead::Request(request, as_read, facts) => (request, as_read, facts),
                HeadRead::Refused(reason) => {
                    // Boxed: the connection's task keeps no room for this rare path's state.
                    Box::pin(refuse(&inbound, reason)).await;
                    return;
                }
                HeadRead::Close => return,
            };
        served += 1;
        // Fields as read have no Upgrade: a request with one gets a map (`take_head_into`).
        let upgrade = (as_read.is_none() && request.headers().contains_key(http::header::UPGRADE))
            .then(oneshot::channel);
        let (upgrade_to, upgrade_from) = match upgrade {
            Some((to, from)) => (Some(to), Some(from)),
            None => (None, None),
        };
        // Boxed: an idle connection keeps no room for a request's state. The box is made
        // first and the future written into it, which lets it be built in place rather
        // than built on the stack and copied whole (3.4 KiB, a request).
        let room = Box::new_uninit();
        let answer = Box::into_pin(Box::write(
            room,
            pipeline::handle(
                request,
                as_read,
                client.clone(),
                worker.clone(),
                upgrade_from,
            ),
        ));
        let Some(response) = answer_unless_gone(answer, &inbound).await else {
            return;
        };
        let kept = match write_answer(&inbound, response, &facts, &client, &mut write).await {
            Ok(Written::Kept) => true,
            Ok(Written::Closed) | Err(_) => false,
            Ok(Written::Switched) => {
                hand_over(inbound, upgrade_to);
                return;
            }
        };
        if !kept {
            let _ = shutdown(&inbound).await;
            return;
        }
        deadline.set_in(timeouts.idle);
        if write.capacity() > IDLE_WRITE_BUFFER {
            write = Vec::new();
        }
    }
}

/// Waits for the stages' answer; `None` when the client closed first (the request is
/// dropped with it, as hyper's server did).
async fn answer_unless_gone<S, F>(
    mut answer: Pin<Box<F>>,
    inbound: &RefCell<Inbound<S>>,
) -> Option<Response<AnswerBody>>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: std::future::Future<Output = Response<AnswerBody>>,
{
    poll_fn(|cx| {
        if let Poll::Ready(response) = answer.as_mut().poll(cx) {
            return Poll::Ready(Some(response));
        }
        match inbound.try_borrow_mut() {
            Ok(mut inbound) => match inbound.poll_client_gone(cx) {
                Poll::Ready(true) => Poll::Ready(None),
                _ => Poll::Pending,
            },
            Err(_) => Poll::Pending,
        }
    })
    .await
}

/// Reads and parses the next head, waiting at most until `deadline`.
async fn read_head<S, Stop>(
    inbound: &Rc<RefCell<Inbound<S>>>,
    mut stop: Pin<&mut Stop>,
    client: &Rc<Client>,
    deadline: &Deadline,
    served: u64,
) -> HeadRead
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
    Stop: std::future::Future<Output = Result<(), tokio::sync::watch::error::RecvError>>,
{
    loop {
        {
            let Ok(mut guard) = inbound.try_borrow_mut() else {
                return HeadRead::Close;
            };
            if !guard.read.is_empty() {
                match take_head(&mut guard) {
                    Ok(Some((request, as_read, facts))) => {
                        drop(guard);
                        let body: Rc<dyn ConnectionBody> = inbound.clone();
                        let request = request.map(|()| RequestBody::H1(body));
                        return HeadRead::Request(request, as_read, facts);
                    }
                    Ok(None) if guard.read.len() >= MAX_HEAD_BYTES => {
                        return HeadRead::Refused(Reason::HeadersTooLarge)
                    }
                    Ok(None) => {}
                    Err(reason) => return HeadRead::Refused(reason),
                }
            } else if guard.read.capacity() > 0 && served > 0 {
                // Idle between requests: the buffer goes back (to the thread's spare ones)
                // until bytes come.
                read_buffers::give_back(&mut guard.read, READ_PIECE);
            }
        }
        let read = poll_fn(|cx| match inbound.try_borrow_mut() {
            Ok(mut inbound) => inbound.poll_read_more(cx),
            Err(_) => Poll::Ready(Ok(0)),
        });
        tokio::select! {
            biased;
            read = read => match read {
                Ok(0) | Err(_) => return HeadRead::Close,
                Ok(_) => {}
            },
            () = deadline.passed() => {
                if served == 0 {
                    metrics::CLIENT_HEAD_TIMEOUTS.inc();
                }
                return HeadRead::Close;
            }
            changed = stop.as_mut(), if !client.closing() => {
                // Answers close from now on. A connection that has had none yet keeps its
                // chance at one (it was accepted: its client has sent, or is sending, its
                // request); one idle between requests closes now.
                client.close_after_answer();
                let idle = inbound.try_borrow().map_or(true, |i| i.read.is_empty());
                if changed.is_err() || (served > 0 && idle) {
                    return HeadRead::Close;
                }
            }
        }
    }
}

/// A head taken from the read buffer: the request (its map empty when the fields are kept
/// as read), the fields as read, and what the connection needs to know of it.
type TakenHead = (Request<()>, Option<RequestFields>, HeadFacts);

/// The head at the start of the read buffer, taken out of it as an `http::Request` whose
/// fields point into it (or are kept as read); `Ok(None)` while it is incomplete; `Err`
/// with the reason that refuses it.
fn take_head<S>(inbound: &mut Inbound<S>) -> Result<Option<TakenHead>, Reason> {
    PLACES.with_borrow_mut(|places| take_head_into(inbound, places))
}

/// Where a field's name and value sit in the read buffer.
type Place = (u32, u32, u32, u32);

thread_local! {
    /// One list per thread, reused: no request allocates or clears one.
    static PLACES: RefCell<Vec<Place>> = RefCell::new(Vec::with_capacity(MAX_HEADERS));
}

fn take_head_into<S>(
    inbound: &mut Inbound<S>,
    places: &mut Vec<Place>,
) -> Result<Option<TakenHead>, Reason> {
    // Where each piece sits in the buffer, so that the fields can share it once the head is
    // split off (the parse borrows it until then).
    let mut slots = header_slots();
    let base = inbound.read.as_ptr() as usize;
    let offset = |piece: &[u8]| piece.as_ptr() as usize - base;
    places.clear();
    // Fields that change how the request is framed or tunnelled, and targets not in origin
    // form, are rewritten for the backend on a map (`pipeline::prepare_for_backend`); every
    // other request keeps its fields where they were read.
    let needs_map;
    let mut known = KnownFields::default();
    let (head_len, target, method, facts, body, expects_continue) =
        match parse_request(&inbound.read, &mut slots) {
            Ok(None) => return Ok(None),
            Err(error) => return Err(error.into()),
            Ok(Some(head)) => {
                for (index, field) in head.headers.iter().enumerate() {
                    known.note(index, field.name.as_bytes(), field.value.len());
                    let name = offset(field.name.as_bytes());
                    let value = offset(field.value);
                    places.push((
                        name as u32,
                        (name + field.name.len()) as u32,
                        value as u32,
                        (value + field.value.len()) as u32,
                    ));
                }
                needs_map = !head.target.starts_with('/') || known.reframes();
                let target = offset(head.target.as_bytes());
                let method = Method::from_bytes(head.method.as_bytes())
                    .map_err(|_| Reason::MalformedHead)?;
                let facts = HeadFacts {
                    minor_version: head.minor_version,
                    keeps_connection: head.keeps_connection(),
                    is_head: head.method == "HEAD",
                };
                (
                    head.head_len,
                    (target, target + head.target.len()),
                    method,
                    facts,
                    head.body,
                    head.expects_continue,
                )
            }
        };
    let bytes = inbound.read.split_to(head_len).freeze();
    let uri = Uri::from_maybe_shared(bytes.slice(target.0..target.1))
        .map_err(|_| Reason::MalformedHead)?;
    let (headers, as_read) = if needs_map {
        let headers =
            switchyard_h1::fields_map(&bytes, places).map_err(|_| Reason::MalformedHead)?;
        (headers, None)
    } else {
        (
            HeaderMap::new(),
            Some(RequestFields::noted(bytes, places, known)),
        )
    };
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = if facts.minor_version == 0 {
        http::Version::HTTP_10
    } else {
        http::Version::HTTP_11
    };
    *request.headers_mut() = headers;
    inbound.body = match body {
        switchyard_h1::RequestBody::Empty | switchyard_h1::RequestBody::Length(0) => BodyLeft::Done,
        switchyard_h1::RequestBody::Length(length) => BodyLeft::Length(length),
        switchyard_h1::RequestBody::Chunked => {
            BodyLeft::Chunked(Box::new(ChunkedReframer::dechunking()))
        }
    };
    inbound.continue_owed =
        (expects_continue && facts.minor_version == 1 && !matches!(inbound.body, BodyLeft::Done))
            .then_some(0);
    Ok(Some((request, as_read, facts)))
}

/// Answers a refused head as its reason's row says (no request exists yet, so no stage, no
/// request id and no app's page), then closes, reading and dropping what the client still
/// sends for a moment first.
async fn refuse<S>(inbound: &RefCell<Inbound<S>>, reason: Reason)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let answer = pipeline::before_request(reason);
    metrics::CLIENT_HEADS_REFUSED
        .with_label_values(&[answer.status().as_str()])
        .inc();
    let mut head = Vec::with_capacity(192);
    switchyard_h1::write_response_parts(
        &mut head,
        answer.status(),
        answer.headers(),
        AnswerFraming::Length(answer.body().len() as u64),
        AnswerConnection::Closed,
        http_date,
    );
    head.extend_from_slice(answer.body());
    let lingered = async {
        write_all(inbound, &head).await?;
        shutdown(inbound).await?;
        let mut dropped = 0;
        while dropped < REFUSAL_LINGER_BYTES {
            let read = poll_fn(|cx| match inbound.try_borrow_mut() {
                Ok(mut inbound) => {
                    inbound.read.clear();
                    inbound.poll_read_more(cx)
                }
                Err(_) => Poll::Ready(Ok(0)),
            })
            .await?;
            if read == 0 {
                break;
            }
            dropped += read;
        }
        Ok::<(), std::io::Error>(())
    };
    let _ = tokio::time::timeout(REFUSAL_LINGER, lingered).await;
}

/// How an answer left the connection.
enum Written {
    Kept,
    Closed,
    /// A 101 went out: the connection is the relay's now.
    Switched,
}

/// Writes the answer: its head and first piece in one write when the piece is in hand,
/// then the rest as it comes, framed for the client.
async fn write_answer<S>(
    inbound: &RefCell<Inbound<S>>,
    response: Response<AnswerBody>,
    facts: &HeadFacts,
    client: &Client,
    out: &mut Vec<u8>,
) -> std::io::Result<Written>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (parts, mut body) = response.into_parts();
    // The backend's fields as read, when no stage made a map of them; the map then holds
    // only the router's own, which replace a field of the same name the app sent.
    let as_read = body.take_answer_fields();
    // A final answer goes before any body was asked for: no 100 is owed any more.
    if let Ok(mut inbound) = inbound.try_borrow_mut() {
        inbound.continue_owed = None;
    }
    let switched = parts.status == StatusCode::SWITCHING_PROTOCOLS;
    let body_read = inbound
        .try_borrow()
        .is_ok_and(|i| matches!(i.body, BodyLeft::Done));
    let keep = facts.keeps_connection
        && body_read
        && !client.closing()
        && !parts
            .headers
            .get(CONNECTION)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
    let (framing, connection, keep) = answer_framing(&parts, &body, as_read.as_ref(), facts, keep);
    out.clear();
    write_head(out, &parts, &body, as_read.as_ref(), framing, connection);
    drop(as_read);
    drop(parts);
    if framing == AnswerFraming::NoBody {
        write_all(inbound, out).await?;
        drop(body);
        return Ok(if switched {
            Written::Switched
        } else if keep {
            Written::Kept
        } else {
            Written::Closed
        });
    }
    let chunked = framing == AnswerFraming::Chunked;
    let mut left = match framing {
        AnswerFraming::Length(length) => Some(length),
        _ => None,
    };
    loop {
        // A piece in hand goes with what is buffered; otherwise what is buffered goes out
        // before waiting (a stream's head is not held back for its first event).
        let frame = match poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx))).await {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                if !out.is_empty() {
                    write_all(inbound, out).await?;
                    out.clear();
                }
                poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
            }
        };
        let data = match frame {
            None => break,
            Some(Err(e)) => {
                // The answer stopped short: what was sent goes out, and the close tells the
                // client it is incomplete.
                log::debug!("listener: an answer stopped short: {e}");
                write_all(inbound, out).await?;
                return Ok(Written::Closed);
            }
            Some(Ok(frame)) => match Frame::into_data(frame) {
                Ok(data) if !data.is_empty() => data,
                _ => continue,
            },
        };
        let data = match left.as_mut() {
            Some(left) => {
                // Never a byte past the length announced: it would read as the next answer.
                let take = usize::try_from(*left).map_or(data.len(), |l| l.min(data.len()));
                *left -= take as u64;
                data.slice(..take)
            }
            None => data,
        };
        if chunked {
            switchyard_h1::write_chunk_size(out, data.len() as u64);
        }
        if data.len() < COALESCE_BELOW {
            out.extend_from_slice(&data);
        } else {
            write_all(inbound, out).await?;
            out.clear();
            write_all(inbound, &data).await?;
        }
        if chunked {
            out.extend_from_slice(b"\r\n");
        }
        if left == Some(0) {
            break;
        }
        if out.len() >= COALESCE_BELOW {
            write_all(inbound, out).await?;
            out.clear();
        }
    }
    if chunked {
        out.extend_from_slice(b"0\r\n\r\n");
    }
    if !out.is_empty() {
        write_all(inbound, out).await?;
    }
    let complete = left.is_none_or(|left| left == 0);
    // The answer's end is counted (and its backend connection pooled) before the next
    // request is read.
    drop(body);
    Ok(if keep && complete {
        Written::Kept
    } else {
        Written::Closed
    })
}

/// How the answer is framed for the client and what becomes of the connection after it;
/// `keep` turns false for an HTTP/1.0 answer whose end only the close can tell.
fn answer_framing(
    parts: &http::response::Parts,
    body: &AnswerBody,
    as_read: Option<&AnswerFields>,
    facts: &HeadFacts,
    mut keep: bool,
) -> (AnswerFraming, AnswerConnection, bool) {
    let status = parts.status;
    let (codings, length) = match as_read {
        Some(fields) => (fields.has_codings(), fields.content_length()),
        None => (
            parts.headers.contains_key(TRANSFER_ENCODING),
            parts
                .headers
                .get(CONTENT_LENGTH)
                .and_then(|v| switchyard_h1::content_length_value(v.as_bytes())),
        ),
    };
    let framing = if facts.is_head
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        AnswerFraming::NoBody
    } else if codings && facts.minor_version == 1 {
        AnswerFraming::Chunked
    } else if let Some(length) = length {
        AnswerFraming::Length(length)
    } else if let Some(length) = body.size_hint().exact() {
        AnswerFraming::Length(length)
    } else if facts.minor_version == 1 {
        AnswerFraming::Chunked
    } else {
        keep = false;
        AnswerFraming::UntilClose
    };
    let connection = if status == StatusCode::SWITCHING_PROTOCOLS {
        AnswerConnection::Switched
    } else if !keep {
        AnswerConnection::Closed
    } else if facts.minor_version == 0 {
        AnswerConnection::KeptForHttp10
    } else {
        AnswerConnection::Kept
    };
    (framing, connection, keep)
}

/// The answer's head into `out`: the app's fields as read (less those the router's own
/// replace) then the router's, or the answer's map.
fn write_head(
    out: &mut Vec<u8>,
    parts: &http::response::Parts,
    body: &AnswerBody,
    as_read: Option<&AnswerFields>,
    framing: AnswerFraming,
    connection: AnswerConnection,
) {
    let status = parts.status;
    let Some(as_read) = as_read else {
        switchyard_h1::write_response_parts(
            out,
            status,
            &parts.headers,
            framing,
            connection,
            http_date,
        );
        return;
    };
    let own = &parts.headers;
    let router = body.request_ctx().map(RouterFields::of);
    // In a plain array: looked at once for each of the app's fields.
    let mut router_fields: [(&[u8], &[u8]); RouterFields::MOST] = [(b"", b""); RouterFields::MOST];
    let mut count = 0;
    for (name, value) in router.iter().flat_map(RouterFields::iter) {
        router_fields[count] = (name.as_str().as_bytes(), value);
        count += 1;
    }
    let router_fields = &router_fields[..count];
    let replaced = |name: &[u8]| {
        router_fields
            .iter()
            .any(|(own, _)| name.eq_ignore_ascii_case(own))
            || (!own.is_empty() && own.keys().any(|k| name.eq_ignore_ascii_case(k.as_ref())))
    };
    let added = router
        .as_ref()
        .and_then(|router| router.sticky_cookie)
        .map(|cookie| (&b"set-cookie"[..], cookie.as_bytes()));
    let fields = || {
        let apps = as_read.iter().filter(|(name, _)| !replaced(name));
        apps.chain(
            own.iter()
                .map(|(name, value)| (name.as_ref(), value.as_bytes())),
        )
        .chain(router_fields.iter().copied())
        .chain(added)
    };
    switchyard_h1::write_answer_head(out, status, fields, framing, connection, http_date);
}

async fn write_all<S>(inbound: &RefCell<Inbound<S>>, mut data: &[u8]) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    while !data.is_empty() {
        let written = poll_fn(|cx| match inbound.try_borrow_mut() {
            Ok(mut inbound) => Pin::new(&mut inbound.stream).poll_write(cx, data),
            Err(_) => Poll::Ready(Err(std::io::ErrorKind::Other.into())),
        })
        .await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        data = &data[written..];
    }
    poll_fn(|cx| match inbound.try_borrow_mut() {
        Ok(mut inbound) => Pin::new(&mut inbound.stream).poll_flush(cx),
        Err(_) => Poll::Ready(Err(std::io::ErrorKind::Other.into())),
    })
    .await
}

/// Ends the router's side of the connection (a FIN; over TLS, close_notify first).
async fn shutdown<S>(inbound: &RefCell<Inbound<S>>) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    poll_fn(|cx| match inbound.try_borrow_mut() {
        Ok(mut inbound) => Pin::new(&mut inbound.stream).poll_shutdown(cx),
        Err(_) => Poll::Ready(Ok(())),
    })
    .await
}

/// After a 101: the socket and what the client sent past its request go to the relay.
fn hand_over<S>(inbound: Rc<RefCell<Inbound<S>>>, to: Option<oneshot::Sender<(ClientSide, Bytes)>>)
where
    S: IntoClientSide,
{
    let (Some(to), Ok(inbound)) = (to, Rc::try_unwrap(inbound)) else {
        return;
    };
    let inbound = inbound.into_inner();
    let early = inbound.read.freeze();
    let _ = to.send((inbound.stream.into_inner().into_client_side(), early));
}

/// The Date field of answers, formatted once a second per thread.
fn http_date() -> [u8; 29] {
    thread_local! {
        static DATE: std::cell::Cell<(u64, [u8; 29])> = const { std::cell::Cell::new((0, [0; 29])) };
    }
    let now = SystemTime::now();
    let second = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with(|date| {
        let (at, formatted) = date.get();
        if at == second {
            return formatted;
        }
        let mut fresh = [0u8; 29];
        let text = httpdate::fmt_http_date(now);
        let len = text.len().min(29);
        fresh[..len].copy_from_slice(&text.as_bytes()[..len]);
        date.set((second, fresh));
        fresh
    })
}
