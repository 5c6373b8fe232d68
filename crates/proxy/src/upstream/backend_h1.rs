//! The router's end of a backend connection: one request at a time in HTTP/1.1, spoken by
//! `crates/h1` and driven by the task of the request that holds the connection. The head
//! is written once, from the request's parts, into a buffer the connection keeps; the
//! answer's head is parsed in place and read once into the `HeaderMap` the client's answer
//! is made of; its body is read by length, by chunks or until close, each piece handed on
//! without a copy but for chunked bodies, whose data is cut out of the chunk lines.
//!
//! hyper's client, which this replaces, ran each connection as a second task fed through
//! a channel and parsed each answer's head into a `HeaderMap` of its own before ours was
//! made: half of the hyper floor's instructions per request (bench/ENGINE.md, issue 46).

use std::future::poll_fn;
use std::io::{ErrorKind, IoSlice};
use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use socket2::SockRef;
use switchyard_h1::{
    header_slots, parse_response, write_placed_request_fields, AnswerFacts, AnswerFields,
    ChunkedReframer, FieldPlace, OwnFields, PlacedFields, RequestBody, ResponseBody,
    RouterFieldsOnly,
};
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use super::failure::BackendFailure;
use super::forward_body::ForwardBody;
use super::outgoing::{AnswerForm, Outgoing, RequestEdits};
use crate::fields_mut::FieldEdits;
use crate::listener::read_buffers;
use crate::proxy_protocol::Destination;
use crate::request_fields::{Fields, Known};
use crate::routing::connections::ShutdownRequest;

/// Room made in the read buffer before each read from a backend.
const READ_PIECE: usize = 16 * 1024;

/// Largest answer head taken from a backend, as hyper's client took (its read buffer's
/// limit): past it, the answer is a 502.
const MAX_ANSWER_HEAD: usize = 64 * 1024;

/// A connection to a backend, ready for one request at a time.
pub(crate) struct BackendConnection {
    stream: TcpStream,
    /// What was read from the backend and not handed on yet.
    read: BytesMut,
    /// Where each request's head is written; kept between requests, so a busy connection
    /// writes its heads without allocating.
    write: Vec<u8>,
    /// Where the fields of the last answer's head sat: kept between answers, like `write`.
    places: Vec<FieldPlace>,
    /// How the answer of the exchange under way hands its fields over.
    answer_form: AnswerForm,
    /// Watched for as long as the connection lives, for the connection table's drains.
    pub(crate) shutdown: Arc<ShutdownRequest>,
    /// Where it goes, and for whom: the key it is kept idle under.
    pub(crate) destination: Destination,
    /// Dropped with the connection: the drain watcher then ends without touching the
    /// descriptor, which another socket may have by then.
    _alive: oneshot::Sender<()>,
}

/// An answer's head, read out of the read buffer.
struct AnswerHead {
    status: StatusCode,
    /// The fields, when asked for in a map (empty otherwise).
    headers: HeaderMap,
    /// The fields as read, when asked for so.
    fields: Option<AnswerFields>,
    framing: Framing,
    keeps_connection: bool,
}

impl AnswerHead {
    /// Reads what `head` says of the answer, and into `places` where the fields the client
    /// gets sit in `buffer`, the bytes it was parsed from (their values will share them).
    fn read_places(
        head: &switchyard_h1::ResponseHead<'_, '_>,
        buffer: &[u8],
        places: &mut Vec<FieldPlace>,
    ) -> (u16, Framing, bool, AnswerFacts) {
        let switched = head.code == 101;
        let facts = switchyard_h1::place_fields(head, buffer, switched, places);
        let framing = match head.body {
            _ if switched => Framing::Done,
            ResponseBody::None | ResponseBody::Length(0) => Framing::Done,
            ResponseBody::Length(length) => Framing::Length(length),
            ResponseBody::Chunked => Framing::Chunked(Box::new(ChunkedReframer::dechunking())),
            ResponseBody::UntilClose => Framing::UntilClose,
        };
        let keeps_connection =
            !switched && head.keeps_connection() && !matches!(head.body, ResponseBody::UntilClose);
        (head.code, framing, keeps_connection, facts)
    }

    /// The answer whose fields sit at `places` in `head_bytes`: the values are slices of
    /// it, not copies (an allocation and a copy per field, which cost more than the parse).
    fn of(
        (code, framing, keeps_connection, facts): (u16, Framing, bool, AnswerFacts),
        head_bytes: Bytes,
        places: &[FieldPlace],
        form: AnswerForm,
    ) -> Result<Self, BackendFailure> {
        let refused = || BackendFailure::Protocol("an answer field HTTP refuses");
        let status = StatusCode::from_u16(code).map_err(|_| refused())?;
        if form == AnswerForm::AsRead && code != 101 {
            // The parse checked names as tokens and values as HTTP's field values: what
            // the map would have refused, it refused first.
            return Ok(Self {
                status,
                headers: HeaderMap::new(),
                fields: Some(AnswerFields::placed(head_bytes, places, facts)),
                framing,
                keeps_connection,
            });
        }
        let headers = switchyard_h1::fields_map(&head_bytes, places).map_err(|_| refused())?;
        Ok(Self {
            status,
            headers,
            fields: None,
            framing,
            keeps_connection,
        })
    }
}

/// The backend's head of a request whose fields go on as read, with the app's stages'
/// edits: its rules remove, set (in place of the client's) and append; compression offers
/// the backend one coding. The rules come after compression, as on a map. A request with
/// no edit (most) takes the writer without them: no check per field.
fn write_request_as_read(
    out: &mut Vec<u8>,
    (method, target): (&[u8], &[u8]),
    placed: &PlacedFields,
    framing: RequestBody,
    extra: &[(&str, &[u8])],
    edits: RequestEdits<'_>,
) {
    if edits.rules.is_none() && edits.accept_encoding.is_none() {
        let own = RouterFieldsOnly::replacing(extra);
        write_placed_request_fields(out, method, target, placed, framing, own);
        return;
    }
    let rules = edits.rules;
    let ruled = |name: &[u8]| rules.is_some_and(|rules| rules.left_out(name));
    // The coding's field, unless a rule removes or sets the field after it.
    let coding = match edits.accept_encoding {
        Some(_) if ruled(b"accept-encoding") => None,
        other => other,
    };
    let own = OwnFields {
        replacing: extra,
        left_out: |name: &[u8]| {
            ruled(name) || (coding.is_some() && name.eq_ignore_ascii_case(b"accept-encoding"))
        },
        more: (rules.into_iter().flat_map(FieldEdits::set))
            .chain(
                coding
                    .flatten()
                    .map(|coding| (&b"accept-encoding"[..], coding.as_bytes())),
            )
            .chain(rules.into_iter().flat_map(FieldEdits::appended)),
    };
    write_placed_request_fields(out, method, target, placed, framing, own);
}

enum Framing {
    Length(u64),
    Chunked(Box<ChunkedReframer>),
    UntilClose,
    Done,
}

impl BackendConnection {
    /// A connection on `stream`, which `shutdown` closes when a drain asks. Boxed for its
    /// whole life: it is moved into each exchange, its answer's body and the pool, and a
    /// pointer moves for less than its bytes did (callgrind: memcpy).
    pub(crate) fn new(
        stream: TcpStream,
        destination: Destination,
        shutdown: Arc<ShutdownRequest>,
    ) -> Box<Self> {
        let (alive, gone) = oneshot::channel();
        let descriptor = stream.as_raw_fd();
        let watched = shutdown.clone();
        tokio::task::spawn_local(async move {
            // Biased: a connection dropped before this task ran is never shut down, as its
            // descriptor may be another socket's now. Both run on the connection's thread,
            // so one that is still alive here still holds the descriptor.
            tokio::select! {
                biased;
                _ = gone => {}
                () = watched.requested() => {
                    // A shutdown, not a close: the request reads it as a backend's close,
                    // with a FIN, not a reset.
                    let _ = nix::sys::socket::shutdown(descriptor, nix::sys::socket::Shutdown::Both);
                }
            }
        });
        Box::new(Self {
            stream,
            read: BytesMut::new(),
            write: Vec::new(),
            places: Vec::new(),
            answer_form: AnswerForm::Map,
            shutdown,
            destination,
            _alive: alive,
        })
    }

    /// Whether the backend closed the connection (or sent what nobody asked for) while it
    /// was idle: a read event since the last read that waited. Without one, no system call.
    pub(crate) fn is_closed(&self) -> bool {
        let mut probe = [MaybeUninit::<u8>::uninit(); 1];
        let peeked = self.stream.try_io(Interest::READABLE, || {
            SockRef::from(&self.stream).peek(&mut probe)
        });
        !matches!(peeked, Err(e) if e.kind() == ErrorKind::WouldBlock)
    }

    /// Idle buffers are given back: a pool of idle connections costs their sockets.
    pub(crate) fn release_buffers(&mut self) {
        read_buffers::give_back(&mut self.read, READ_PIECE);
        if self.write.capacity() > 4096 {
            self.write = Vec::new();
        }
    }

    /// Sends the request of `parts` (prepared for a backend; its fields those `as_read` when
    /// it has them) with `forwarding` (written in place of the client's fields of those
    /// names) and `body`, and
    /// reads the answer's head; its body follows from the returned response's.
    /// `answers_head`: the request is a HEAD, whose answer has no body whatever it
    /// announces.
    pub(crate) async fn exchange(
        mut self: Box<Self>,
        request: &Outgoing<'_>,
        mut body: ForwardBody,
        answers_head: bool,
    ) -> Result<Response<BackendBody>, BackendFailure> {
        let &Outgoing {
            head: parts,
            as_read,
            edits,
            forwarding,
            answer_form,
            ..
        } = request;
        self.answer_form = answer_form;
        let fields = Fields::of(&parts.headers, as_read);
        let upgrade = fields.get(Known::Upgrade);
        let codings = fields.get(Known::TransferEncoding);
        let declared = fields
            .get(Known::ContentLength)
            .and_then(switchyard_h1::content_length_value);
        // The framing checked when the request came in: codings other than chunked are the
        // app's to undo (their line goes on as it came, normalised), chunked is re-made
        // from the body's pieces, a length is kept and held to.
        let (framing, chunked) = match (codings, declared) {
            (Some(_), _) => (RequestBody::Empty, true),
            (None, Some(length)) => (RequestBody::Length(length), false),
            (None, None) if body.is_end_stream() => (RequestBody::Empty, false),
            (None, None) => (RequestBody::Chunked, true),
        };
        const MOST: usize = crate::forwarded::MOST_FIELDS + 2;
        let mut extra: [(&str, &[u8]); MOST] = [("", b""); MOST];
        let mut extras = 0;
        for (slot, field) in extra[..MOST - 2].iter_mut().zip(forwarding.fields()) {
            *slot = field;
            extras += 1;
        }
        if let Some(upgrade) = upgrade {
            extra[extras] = ("connection", b"upgrade");
            extra[extras + 1] = ("upgrade", upgrade);
            extras += 2;
        } else if let Some(codings) = codings {
            extra[extras] = ("transfer-encoding", codings);
            extras += 1;
        }
        let mut head = std::mem::take(&mut self.write);
        head.clear();
        match as_read {
            Some(fields) => {
                let method = parts.method.as_str().as_bytes();
                let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
                let line = (method, target.as_bytes());
                let extra = &extra[..extras];
                write_request_as_read(&mut head, line, fields.placed(), framing, extra, edits);
            }
            None => switchyard_h1::write_request_parts(&mut head, parts, framing, &extra[..extras]),
        }
        // An empty chunked body still needs its last chunk.
        let answered_early = if body.is_end_stream() && !chunked {
            write_all(&self.stream, &[IoSlice::new(&head)])
                .await
                .map(|()| None)
                .map_err(BackendFailure::from_io)
        } else {
            let sent = self.send_body(&head, &mut body, chunked, declared, answers_head);
            sent.await
        };
        self.write = head;
        let answered_early = answered_early?;
        drop(body);
        let body_sent = answered_early.is_none();
        let answer = match answered_early {
            Some(answer) => answer,
            None => self.final_answer_head(answers_head).await?,
        };
        let reusable = body_sent && answer.keeps_connection;
        let mut response = Response::new(BackendBody {
            connection: Some(self),
            framing: answer.framing,
            reusable,
            fields: answer.fields,
        });
        *response.status_mut() = answer.status;
        *response.headers_mut() = answer.headers;
        Ok(response)
    }

    /// Sends `head` with the body's first piece (one write, and a body that fails before
    /// its first piece has sent the backend nothing, as hyper's client did), then the rest
    /// of the body, chunked or held to its declared length. The answer's head when the
    /// backend answered before the body was all sent (nothing more is sent then, and the
    /// connection is not kept: the backend has not read the rest).
    async fn send_body(
        &mut self,
        head: &[u8],
        body: &mut ForwardBody,
        chunked: bool,
        mut left: Option<u64>,
        answers_head: bool,
    ) -> Result<Option<AnswerHead>, BackendFailure> {
        let mut unsent_head = Some(head);
        loop {
            let frame = if unsent_head.is_some() {
                poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
            } else {
                tokio::select! {
                    biased;
                    answer = self.final_answer_head(answers_head) => return answer.map(Some),
                    frame = poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)) => frame,
                }
            };
            let head = IoSlice::new(unsent_head.unwrap_or_default());
            let data = match frame {
                None => {
                    if left.is_some_and(|left| left > 0) {
                        return Err(BackendFailure::Protocol("the client's body ended short"));
                    }
                    let last: &[u8] = if chunked { b"0\r\n\r\n" } else { b"" };
                    write_all(&self.stream, &[head, IoSlice::new(last)])
                        .await
                        .map_err(BackendFailure::from_io)?;
                    return Ok(None);
                }
                Some(Err(e)) => return Err(BackendFailure::ClientBody(e.to_string())),
                // Trailers are not forwarded (as nginx does not), and never become fields.
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if !data.is_empty() => data,
                    _ => continue,
                },
            };
            if let Some(left) = left.as_mut() {
                // Hyper's readers hold a body to its length; this holds the backend's side
                // to it whatever reads the body, so no byte past it reads as a request.
                *left = left
                    .checked_sub(data.len() as u64)
                    .ok_or(BackendFailure::Protocol(
                        "the client's body ran past its length",
                    ))?;
            }
            let written = if chunked {
                let mut size = Vec::with_capacity(18);
                switchyard_h1::write_chunk_size(&mut size, data.len() as u64);
                write_all(
                    &self.stream,
                    &[
                        head,
                        IoSlice::new(&size),
                        IoSlice::new(&data),
                        IoSlice::new(b"\r\n"),
                    ],
                )
                .await
            } else {
                write_all(&self.stream, &[head, IoSlice::new(&data)]).await
            };
            written.map_err(BackendFailure::from_io)?;
            unsent_head = None;
        }
    }

    /// Reads until the final answer's head is whole and takes it (interim ones, a
    /// `100 Continue`, are dropped on the way); cancellable between reads, as a head is
    /// taken out of the buffer only in the poll that returns it.
    async fn final_answer_head(
        &mut self,
        answers_head: bool,
    ) -> Result<AnswerHead, BackendFailure> {
        loop {
            if let Some(answer) = self.answer_head(answers_head)? {
                return Ok(answer);
            }
            self.read_some().await?;
        }
    }

    /// The final answer's head, once it is whole in the read buffer (taken out of it);
    /// interim answers before it are dropped. One parse per head: the fields are read into
    /// the answer's `HeaderMap` from the parse that found the head whole.
    fn answer_head(&mut self, answers_head: bool) -> Result<Option<AnswerHead>, BackendFailure> {
        loop {
            if self.read.is_empty() {
                return Ok(None);
            }
            let mut slots = header_slots();
            let head = match parse_response(&self.read, &mut slots, answers_head) {
                Ok(Some(head)) => head,
                Ok(None) if self.read.len() > MAX_ANSWER_HEAD => {
                    return Err(BackendFailure::Protocol("an answer head past 64 KiB"))
                }
                Ok(None) => return Ok(None),
                Err(_) => return Err(BackendFailure::Protocol("a malformed answer head")),
            };
            let length = head.head_len;
            if head.is_interim() {
                self.read.advance(length);
                continue;
            }
            let facts = AnswerHead::read_places(&head, &self.read, &mut self.places);
            let head_bytes = self.read.split_to(length).freeze();
            return AnswerHead::of(facts, head_bytes, &self.places, self.answer_form).map(Some);
        }
    }

    /// Reads what the backend has sent; its close before the answer is whole is a failure.
    async fn read_some(&mut self) -> Result<(), BackendFailure> {
        if self.read.capacity() == 0 {
            self.read = read_buffers::take(READ_PIECE);
        } else {
            self.read.reserve(READ_PIECE);
        }
        let read = poll_fn(|cx| {
            tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.read)
        })
        .await
        .map_err(BackendFailure::from_io)?;
        if read == 0 {
            return Err(BackendFailure::Closed);
        }
        Ok(())
    }
}

/// Writes all of `pieces`, in as few system calls as the socket takes them.
async fn write_all(stream: &TcpStream, pieces: &[IoSlice<'_>]) -> std::io::Result<()> {
    let total: usize = pieces.iter().map(|p| p.len()).sum();
    let mut written = 0;
    while written < total {
        // The pieces not yet written whole, the first of them cut where the last write
        // stopped.
        let mut skip = written;
        let mut rest = [IoSlice::new(&[]); 4];
        let mut count = 0;
        for piece in pieces {
            if skip >= piece.len() {
                skip -= piece.len();
                continue;
            }
            if count < rest.len() {
                rest[count] = IoSlice::new(&piece[skip..]);
                count += 1;
            }
            skip = 0;
        }
        stream.writable().await?;
        let n = match stream.try_write_vectored(&rest[..count]) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Err(ErrorKind::WriteZero.into());
        }
        written += n;
    }
    Ok(())
}

/// The body of a backend's answer, read from its connection; the connection goes back to
/// the pool (`take_reusable`) once the body is read to its end.
pub(crate) struct BackendBody {
    connection: Option<Box<BackendConnection>>,
    framing: Framing,
    /// The connection may carry another request after this answer.
    reusable: bool,
    /// The answer's fields, when they were asked for as read ([`AnswerForm::AsRead`]).
    fields: Option<AnswerFields>,
}

impl BackendBody {
    /// The answer's fields as read, when they were asked for so: taken once, by whoever
    /// writes the client's head.
    pub(crate) fn take_fields(&mut self) -> Option<AnswerFields> {
        self.fields.take()
    }

    /// Gives back the fields [`Self::take_fields`] took, edited.
    pub(crate) fn put_fields(&mut self, fields: Option<AnswerFields>) {
        self.fields = fields;
    }

    /// The connection, once the answer has been read to its end and the connection may
    /// carry another request; `None` otherwise (dropped, it closes).
    pub(crate) fn take_reusable(&mut self) -> Option<Box<BackendConnection>> {
        let ended = matches!(self.framing, Framing::Done);
        let mut connection = self.connection.take()?;
        // Bytes past the answer are none the router asked for: the connection is not
        // trusted with another request.
        if !(ended && self.reusable && connection.read.is_empty()) {
            return None;
        }
        connection.release_buffers();
        Some(connection)
    }

    /// Whether the whole body came with the head (a small answer): nothing is left to
    /// read from the backend.
    pub(crate) fn all_in_hand(&self) -> bool {
        match (&self.framing, &self.connection) {
            (Framing::Done, _) => true,
            (Framing::Length(left), Some(connection)) => connection.read.len() as u64 >= *left,
            _ => false,
        }
    }

    /// The backend's socket after a `101 Switching Protocols`, with what it sent past the
    /// head.
    pub(crate) fn into_upgraded(mut self) -> Option<(TcpStream, Bytes)> {
        let connection = self.connection.take()?;
        Some((connection.stream, connection.read.freeze()))
    }

    fn next_piece(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BackendFailure>>> {
        let Some(connection) = self.connection.as_mut() else {
            return Poll::Ready(None);
        };
        loop {
            let read = &mut connection.read;
            match &mut self.framing {
                Framing::Done => return Poll::Ready(None),
                Framing::Length(left) if !read.is_empty() => {
                    let take = usize::try_from(*left).map_or(read.len(), |l| l.min(read.len()));
                    *left -= take as u64;
                    if *left == 0 {
                        self.framing = Framing::Done;
                    }
                    return Poll::Ready(Some(Ok(read.split_to(take).freeze())));
                }
                Framing::UntilClose if !read.is_empty() => {
                    return Poll::Ready(Some(Ok(read.split().freeze())));
                }
                Framing::Chunked(reframer) if !read.is_empty() => {
                    let mut data = Vec::new();
                    let reframed = reframer
                        .reframe(read, &mut data)
                        .map_err(|_| BackendFailure::Protocol("a malformed chunk"))?;
                    read.advance(reframed.consumed);
                    if reframed.done {
                        self.framing = Framing::Done;
                    }
                    if !data.is_empty() {
                        return Poll::Ready(Some(Ok(Bytes::from(data))));
                    }
                    continue;
                }
                _ => {}
            }
            read.reserve(READ_PIECE);
            let n = ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut connection.stream),
                cx,
                read
            ))
            .map_err(BackendFailure::from_io)?;
            if n == 0 {
                if matches!(self.framing, Framing::UntilClose) {
                    self.framing = Framing::Done;
                    self.reusable = false;
                    return Poll::Ready(None);
                }
                return Poll::Ready(Some(Err(BackendFailure::Closed)));
            }
        }
    }
}

impl Body for BackendBody {
    type Data = Bytes;
    type Error = BackendFailure;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BackendFailure>>> {
        let piece = ready!(self.get_mut().next_piece(cx));
        Poll::Ready(piece.map(|piece| piece.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.framing, Framing::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Done => SizeHint::with_exact(0),
            Framing::Length(left) => SizeHint::with_exact(left),
            Framing::Chunked(_) | Framing::UntilClose => SizeHint::default(),
        }
    }
}
