//! The floor of an HTTP/1 path of our own (issue 46's gate), laid out as hyper-floor and
//! nginx's workers (per thread: a current-thread runtime, an SO_REUSEPORT listener, a pool
//! of backend connections) but with Switchyard's codec (`crates/h1`) instead of hyper:
//! the head parsed by httparse into a fixed array of header slices, written once into a
//! buffer the connection reuses, and the backend connection driven by the client
//! connection's own task — no channel, no second task, no header map, no allocation per
//! request once a connection's buffers have grown. Bodies go by their Content-Length count
//! or through the chunk state machine; WebSocket upgrades are relayed.
//!
//! Each connection has a deadline, moved as it waits for a request and as the request is
//! forwarded (nginx's keep-alive and header timeouts; one bound on each exchange), kept
//! as a tick of a per-thread clock that one task a thread sweeps each second. What a
//! production path needs beyond this (retries on other backends, the drain table, the
//! stages) is left out, as hyper-floor leaves it out: this is the least a router on this
//! path can cost.
//!
//! `h1-floor --listen 127.0.0.1:8080 --threads 2 --route app7.bench=127.0.0.1:9001 …`

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use nix::sys::time::{TimeSpec, TimeValLike};
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use openssl::ssl::{Ssl, SslAcceptor};
use switchyard_h1::{
    header_slots, parse_request, parse_response, write_request_head, write_response_head,
    ChunkedReframer, ClientSide, RequestBody, RequestHead, ResponseBody, MAX_HEAD_BYTES,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_openssl::SslStream;

#[path = "../floor_options.rs"]
mod floor_options;
use floor_options::reuse_port_listener;

/// How long a connection may wait for its next request, and a head may take to arrive
/// (nginx: keepalive_timeout 75 s, client_header_timeout 60 s).
const IDLE_TIMEOUT_S: u32 = 60;
/// How long one exchange may take, body and answer included. Coarser than nginx's
/// per-read timeouts: the floor prices the deadlines; the production path counts
/// progress.
const EXCHANGE_TIMEOUT_S: u32 = 300;

/// The connections' deadlines, one thread's: a tick a second, and for each connection
/// the tick past which it is closed. Moving a deadline is a store; no connection has a
/// timer of its own (a tokio timer per connection cost 1.7k instructions per request, 11%
/// of the floor's work: the select on it, the moves of the futures it wraps, and the
/// timer wheel's bookkeeping at every turn of the loop). One task per thread looks once a
/// second and ends the connections whose tick has passed, as nginx's timer resolution
/// trades precision for a loop without timer work.
struct Deadlines {
    tick: Cell<u32>,
    connections: RefCell<Vec<(std::rc::Weak<Cell<u32>>, tokio::task::AbortHandle)>>,
}

impl Deadlines {
    /// A connection's deadline, `seconds` from now.
    fn due_in(&self, deadline: &Cell<u32>, seconds: u32) {
        deadline.set(self.tick.get() + seconds);
    }

    /// Ticks once a second on a timerfd in the thread's epoll set, not on a tokio timer:
    /// with any tokio timer registered, each turn of the loop consults the timer wheel
    /// (0.8k instructions per request at 200 req/s, measured with an interval timer).
    async fn sweep(self: Rc<Self>) -> io::Result<()> {
        let timer = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )?;
        timer.set(
            Expiration::Interval(TimeSpec::seconds(1)),
            TimerSetTimeFlags::empty(),
        )?;
        // AsyncFd::new is deprecated for types that could close their descriptor while it
        // is registered (tokio PR 8587); TimerTick owns its TimerFd for as long as the
        // AsyncFd holds it, so the registration cannot outlive the descriptor.
        #[allow(deprecated)]
        let timer = tokio::io::unix::AsyncFd::new(TimerTick(timer))?;
        loop {
            let mut ready = timer.readable().await?;
            if ready
                .try_io(|timer| timer.get_ref().0.wait().map_err(io::Error::from))
                .is_err()
            {
                continue;
            }
            let tick = self.tick.get() + 1;
            self.tick.set(tick);
            self.connections
                .borrow_mut()
                .retain(|(deadline, task)| match deadline.upgrade() {
                    Some(deadline) if deadline.get() < tick => {
                        task.abort();
                        false
                    }
                    Some(_) => true,
                    None => false,
                });
        }
    }
}

/// The deadlines' timerfd, as tokio's AsyncFd takes it (a raw descriptor).
struct TimerTick(TimerFd);

impl std::os::fd::AsRawFd for TimerTick {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd;
        self.0.as_fd().as_raw_fd()
    }
}

/// What a connection's buffers start with; they grow for a larger head or read.
const BUFFER_BYTES: usize = 4096;
/// Idle backend connections kept per backend and thread.
const IDLE_PER_BACKEND: usize = 1024;

/// One thread's state: nothing in it is shared with another thread.
struct Worker {
    routes: HashMap<Box<[u8]>, SocketAddr>,
    idle: RefCell<HashMap<SocketAddr, Vec<TcpStream>>>,
    deadlines: Rc<Deadlines>,
}

impl Worker {
    fn backend_for(&self, authority: &[u8]) -> Option<SocketAddr> {
        let host = match authority.iter().rposition(|&b| b == b':') {
            Some(colon) if !authority.ends_with(b"]") => &authority[..colon],
            _ => authority,
        };
        let host = host.strip_suffix(b".").unwrap_or(host);
        let mut lower = [0u8; 255];
        let lower = lower.get_mut(..host.len())?;
        for (to, from) in lower.iter_mut().zip(host) {
            *to = from.to_ascii_lowercase();
        }
        self.routes.get(&*lower).copied()
    }

    fn idle_connection(&self, backend: SocketAddr) -> Option<TcpStream> {
        self.idle.borrow_mut().get_mut(&backend)?.pop()
    }

    fn keep_idle(&self, backend: SocketAddr, connection: TcpStream) {
        let mut idle = self.idle.borrow_mut();
        let kept = idle.entry(backend).or_default();
        if kept.len() < IDLE_PER_BACKEND {
            kept.push(connection);
        }
    }
}

/// What is left of a request once its head has been written for the backend.
struct Forward {
    backend: SocketAddr,
    body: RequestBody,
    answers_head: bool,
    idempotent: bool,
    websocket: bool,
    expects_continue: bool,
    client: ClientSide,
}

/// A request the router answers itself, and whether the connection can go on after it.
struct Refusal {
    status: &'static [u8],
    keep_alive: bool,
}

/// The fields nginx's configuration in run.py adds, so the floor does the work it does.
struct Forwarded {
    client_address: Box<[u8]>,
    proto: &'static [u8],
}

fn plan(
    worker: &Worker,
    head: &RequestHead<'_, '_>,
    forwarded: &Forwarded,
    out: &mut Vec<u8>,
) -> Result<Forward, Refusal> {
    let keep_alive = head.keeps_connection();
    let Some(backend) = head.authority.and_then(|a| worker.backend_for(a)) else {
        return Err(Refusal {
            status: b"404 Not Found",
            keep_alive: keep_alive && head.body == RequestBody::Empty,
        });
    };
    ready_for_head(out);
    write_request_head(
        out,
        head,
        true,
        &[
            ("X-Forwarded-For", &forwarded.client_address),
            ("X-Forwarded-Proto", forwarded.proto),
        ],
    );
    Ok(Forward {
        backend,
        body: head.body,
        answers_head: head.method == "HEAD",
        idempotent: head.is_idempotent(),
        websocket: head.websocket_upgrade,
        expects_continue: head.expects_continue,
        client: ClientSide {
            minor_version: head.minor_version,
            keep_alive,
            chunked: head.minor_version >= 1,
        },
    })
}

/// Empties `buffer` for a head to be written into it, with room for one.
fn ready_for_head(buffer: &mut Vec<u8>) {
    buffer.clear();
    buffer.reserve(BUFFER_BYTES);
}

async fn read_more<R: AsyncRead + Unpin>(from: &mut R, buffer: &mut Vec<u8>) -> io::Result<usize> {
    if buffer.capacity() - buffer.len() < 1024 {
        buffer.reserve(BUFFER_BYTES);
    }
    from.read_buf(buffer).await
}

async fn answer_locally<S: AsyncWrite + Unpin>(
    client: &mut S,
    refusal: &Refusal,
) -> io::Result<()> {
    let mut out = Vec::with_capacity(96);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(refusal.status);
    out.extend_from_slice(b"\r\nContent-Length: 0\r\n");
    if !refusal.keep_alive {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    client.write_all(&out).await
}

/// A client transport that can be waited on without a read buffer: an idle keep-alive
/// connection holds none, as nginx's do not.
trait ClientStream: AsyncRead + AsyncWrite + Unpin {
    async fn readable(&self) -> io::Result<()>;
}

impl ClientStream for TcpStream {
    async fn readable(&self) -> io::Result<()> {
        TcpStream::readable(self).await
    }
}

impl ClientStream for SslStream<TcpStream> {
    async fn readable(&self) -> io::Result<()> {
        // Called after a read found nothing: OpenSSL holds no whole record, so the next
        // bytes come from the socket.
        if self.ssl().pending() > 0 {
            return Ok(());
        }
        self.get_ref().readable().await
    }
}

/// Polls `future` once: its output if it is ready now, `None` (and the future dropped)
/// if it would wait.
async fn now<F: std::future::Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|context| match future.as_mut().poll(context) {
        std::task::Poll::Ready(output) => std::task::Poll::Ready(Some(output)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await
}

/// One client connection, from its first request to its close.
struct Connection<S> {
    client: S,
    /// Bytes read from the client and not yet forwarded (a pipelined request may follow).
    from_client: Vec<u8>,
    /// A head (and the body bytes that came with it) on its way out.
    out: Vec<u8>,
    /// Bytes read from the backend.
    from_backend: Vec<u8>,
    forwarded: Forwarded,
    /// The tick of `Worker::deadlines` past which the connection is closed.
    deadline: Rc<Cell<u32>>,
}

/// What the rest of an exchange needs to know of the answer's head.
struct AnswerHead {
    head_len: usize,
    body: ResponseBody,
    backend_keeps: bool,
    switching: bool,
    closes: bool,
    interim: bool,
}

enum Next {
    Request,
    Close,
}

impl<S: ClientStream> Connection<S> {
    /// Reads more of the client's bytes. Between requests, when nothing has arrived yet,
    /// the connection's buffers are given back while it waits (a connection that is
    /// sent its next request at once keeps them and allocates nothing).
    async fn read_from_client(&mut self, between_requests: bool) -> io::Result<usize> {
        if !between_requests {
            return read_more(&mut self.client, &mut self.from_client).await;
        }
        if let Some(read) = now(read_more(&mut self.client, &mut self.from_client)).await {
            return read;
        }
        self.release_buffers();
        self.client.readable().await?;
        read_more(&mut self.client, &mut self.from_client).await
    }

    fn release_buffers(&mut self) {
        self.from_client = Vec::new();
        self.out = Vec::new();
        self.from_backend = Vec::new();
    }

    // The two heads are parsed and written in plain functions, not in the async ones: the
    // header slots (3.2 KiB) then live on the stack for the parse alone instead of in
    // every connection's future.

    /// The next request, if its head has arrived: written for its backend into `out`, or
    /// the answer the router gives it itself.
    fn next_request(&mut self, worker: &Worker) -> Option<Result<Forward, Refusal>> {
        if self.from_client.is_empty() {
            return None;
        }
        let mut slots = header_slots();
        let refused = match parse_request(&self.from_client, &mut slots) {
            Ok(Some(head)) => {
                let head_len = head.head_len;
                let planned = plan(worker, &head, &self.forwarded, &mut self.out);
                self.from_client.drain(..head_len);
                return Some(planned);
            }
            Ok(None) if self.from_client.len() < MAX_HEAD_BYTES => return None,
            Ok(None) => 431,
            Err(refused) => refused.status(),
        };
        let status: &'static [u8] = match refused {
            431 => b"431 Request Header Fields Too Large",
            _ => b"400 Bad Request",
        };
        Some(Err(Refusal {
            status,
            keep_alive: false,
        }))
    }

    /// The backend's answer head, if it has arrived, written for the client into `out`.
    /// `Err`: the backend's answer cannot be forwarded.
    fn answer_head(&mut self, forward: &Forward) -> Result<Option<AnswerHead>, ()> {
        if self.from_backend.is_empty() {
            return Ok(None);
        }
        let mut slots = header_slots();
        let head = match parse_response(&self.from_backend, &mut slots, forward.answers_head) {
            Ok(Some(head)) => head,
            Ok(None) if self.from_backend.len() < MAX_HEAD_BYTES => return Ok(None),
            Ok(None) | Err(_) => return Err(()),
        };
        let mut client = forward.client;
        let switching = head.code == 101 && forward.websocket;
        if head.code == 101 && !switching {
            return Err(());
        }
        // An answer the backend ends by closing, or a chunked one sent to an HTTP/1.0
        // client as its data alone, ends the client's connection too.
        let ends_by_close = head.body == ResponseBody::UntilClose
            || (head.body == ResponseBody::Chunked && !client.chunked);
        client.keep_alive &= !ends_by_close;
        ready_for_head(&mut self.out);
        write_response_head(&mut self.out, &head, client, &[]);
        Ok(Some(AnswerHead {
            head_len: head.head_len,
            body: head.body,
            backend_keeps: head.keeps_connection(),
            switching,
            closes: !client.keep_alive,
            interim: head.is_interim(),
        }))
    }

    async fn serve(mut self, worker: Rc<Worker>) -> io::Result<()> {
        loop {
            worker.deadlines.due_in(&self.deadline, IDLE_TIMEOUT_S);
            let Some(forward) = self.next_head(&worker).await? else {
                return Ok(());
            };
            let next = match forward {
                Ok(forward) => {
                    worker.deadlines.due_in(&self.deadline, EXCHANGE_TIMEOUT_S);
                    self.forward(&worker, forward).await?
                }
                Err(refusal) => {
                    answer_locally(&mut self.client, &refusal).await?;
                    if refusal.keep_alive {
                        Next::Request
                    } else {
                        Next::Close
                    }
                }
            };
            if let Next::Close = next {
                return self.client.shutdown().await;
            }
        }
    }

    /// Reads until the next request's head is in. `None`: the client closed between requests.
    async fn next_head(&mut self, worker: &Worker) -> io::Result<Option<Result<Forward, Refusal>>> {
        loop {
            if let Some(planned) = self.next_request(worker) {
                return Ok(Some(planned));
            }
            let between_requests = self.from_client.is_empty();
            if self.read_from_client(between_requests).await? == 0 {
                return Ok(None);
            }
        }
    }

    /// Sends the request to its backend and the answer to the client.
    async fn forward(&mut self, worker: &Worker, forward: Forward) -> io::Result<Next> {
        // The body bytes that came with the head go out with it, in one write.
        let mut length_left = 0;
        let mut chunks = ChunkedReframer::new();
        match forward.body {
            RequestBody::Empty => {}
            RequestBody::Length(length) => {
                let here = self
                    .from_client
                    .len()
                    .min(usize::try_from(length).unwrap_or(usize::MAX));
                self.out.extend_from_slice(&self.from_client[..here]);
                self.from_client.drain(..here);
                length_left = length - here as u64;
            }
            RequestBody::Chunked => match chunks.reframe(&self.from_client, &mut self.out) {
                Ok(read) => {
                    self.from_client.drain(..read.consumed);
                }
                Err(_) => {
                    let refusal = Refusal {
                        status: b"400 Bad Request",
                        keep_alive: false,
                    };
                    answer_locally(&mut self.client, &refusal).await?;
                    return Ok(Next::Close);
                }
            },
        }
        let body_follows =
            length_left > 0 || (forward.body == RequestBody::Chunked && !chunks.is_done());
        let mut reused = true;
        let mut backend = match worker.idle_connection(forward.backend) {
            Some(connection) => connection,
            None => {
                reused = false;
                match connect(forward.backend).await {
                    Ok(connection) => connection,
                    Err(_) => return self.bad_gateway().await,
                }
            }
        };
        loop {
            let sent = backend.write_all(&self.out).await;
            if sent.is_ok() && !body_follows {
                // Read the answer; a pooled connection the backend had closed answers
                // nothing, and an idempotent request goes again on a new one.
                self.from_backend.clear();
                match read_more(&mut backend, &mut self.from_backend).await {
                    Ok(0) | Err(_) if reused && forward.idempotent => {}
                    Ok(0) | Err(_) => return self.bad_gateway().await,
                    Ok(_) => break,
                }
            } else if sent.is_ok() {
                self.from_backend.clear();
                break;
            } else if !(reused && forward.idempotent) {
                return self.bad_gateway().await;
            }
            reused = false;
            backend = match connect(forward.backend).await {
                Ok(connection) => connection,
                Err(_) => return self.bad_gateway().await,
            };
        }
        if body_follows {
            if forward.expects_continue {
                self.client
                    .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                    .await?;
            }
            if !self
                .send_rest_of_body(&mut backend, forward.body, length_left, &mut chunks)
                .await?
            {
                return Ok(Next::Close);
            }
        }
        self.answer(worker, backend, &forward).await
    }

    /// Streams the part of the request body that did not come with the head. `false`: the
    /// client's body was bad or cut short, and its connection closes.
    async fn send_rest_of_body(
        &mut self,
        backend: &mut TcpStream,
        body: RequestBody,
        mut length_left: u64,
        chunks: &mut ChunkedReframer,
    ) -> io::Result<bool> {
        loop {
            if read_more(&mut self.client, &mut self.from_client).await? == 0 {
                return Ok(false);
            }
            if body == RequestBody::Chunked {
                self.out.clear();
                let Ok(read) = chunks.reframe(&self.from_client, &mut self.out) else {
                    return Ok(false);
                };
                self.from_client.drain(..read.consumed);
                backend.write_all(&self.out).await?;
                if read.done {
                    return Ok(true);
                }
            } else {
                let here = self
                    .from_client
                    .len()
                    .min(usize::try_from(length_left).unwrap_or(usize::MAX));
                backend.write_all(&self.from_client[..here]).await?;
                self.from_client.drain(..here);
                length_left -= here as u64;
                if length_left == 0 {
                    return Ok(true);
                }
            }
        }
    }

    /// Reads the backend's answer (after interim ones) and forwards it.
    async fn answer(
        &mut self,
        worker: &Worker,
        mut backend: TcpStream,
        forward: &Forward,
    ) -> io::Result<Next> {
        let AnswerHead {
            head_len,
            body,
            backend_keeps,
            switching,
            closes,
            interim: _,
        } = loop {
            match self.answer_head(forward) {
                Ok(Some(head)) if head.interim => {
                    self.client.write_all(&self.out).await?;
                    self.from_backend.drain(..head.head_len);
                }
                Ok(Some(head)) => break head,
                Ok(None) => {
                    if read_more(&mut backend, &mut self.from_backend).await? == 0 {
                        return self.bad_gateway().await;
                    }
                }
                Err(()) => return self.bad_gateway().await,
            }
        };
        if switching {
            self.out.extend_from_slice(&self.from_backend[head_len..]);
            self.client.write_all(&self.out).await?;
            backend.write_all(&self.from_client).await?;
            self.from_client.clear();
            // The tunnel's own buffers carry it from here.
            self.release_buffers();
            let _ = tokio::io::copy_bidirectional(&mut self.client, &mut backend).await;
            return Ok(Next::Close);
        }
        let backend_clean = match body {
            ResponseBody::None => {
                self.client.write_all(&self.out).await?;
                self.from_backend.len() == head_len
            }
            ResponseBody::Length(length) => {
                self.relay_length(&mut backend, head_len, length).await?
            }
            ResponseBody::Chunked => {
                let reframer = if forward.client.chunked {
                    ChunkedReframer::new()
                } else {
                    ChunkedReframer::dechunking()
                };
                self.relay_chunked(&mut backend, head_len, reframer).await?
            }
            ResponseBody::UntilClose => {
                self.out.extend_from_slice(&self.from_backend[head_len..]);
                self.client.write_all(&self.out).await?;
                tokio::io::copy(&mut backend, &mut self.client).await?;
                false
            }
        };
        if backend_clean && backend_keeps {
            worker.keep_idle(forward.backend, backend);
        }
        Ok(if closes { Next::Close } else { Next::Request })
    }

    /// A Content-Length body: what came with the head goes out with the answer's head, the
    /// rest straight from the read buffer. `true`: the backend sent nothing past it.
    async fn relay_length(
        &mut self,
        backend: &mut TcpStream,
        head_len: usize,
        length: u64,
    ) -> io::Result<bool> {
        let arrived = self.from_backend.len() - head_len;
        let here = arrived.min(usize::try_from(length).unwrap_or(usize::MAX));
        self.out
            .extend_from_slice(&self.from_backend[head_len..head_len + here]);
        self.client.write_all(&self.out).await?;
        let mut left = length - here as u64;
        let mut clean = arrived == here;
        while left > 0 {
            self.from_backend.clear();
            let read = read_more(backend, &mut self.from_backend).await?;
            if read == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let here = read.min(usize::try_from(left).unwrap_or(usize::MAX));
            self.client.write_all(&self.from_backend[..here]).await?;
            left -= here as u64;
            clean = read == here;
        }
        Ok(clean)
    }

    async fn relay_chunked(
        &mut self,
        backend: &mut TcpStream,
        head_len: usize,
        mut reframer: ChunkedReframer,
    ) -> io::Result<bool> {
        let mut from = head_len;
        loop {
            let read = reframer
                .reframe(&self.from_backend[from..], &mut self.out)
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
            self.client.write_all(&self.out).await?;
            if read.done {
                return Ok(from + read.consumed == self.from_backend.len());
            }
            self.out.clear();
            self.from_backend.clear();
            from = 0;
            if read_more(backend, &mut self.from_backend).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    async fn bad_gateway(&mut self) -> io::Result<Next> {
        let refusal = Refusal {
            status: b"502 Bad Gateway",
            keep_alive: false,
        };
        answer_locally(&mut self.client, &refusal).await?;
        Ok(Next::Close)
    }
}

async fn connect(backend: SocketAddr) -> io::Result<TcpStream> {
    let stream = TcpStream::connect(backend).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

fn serve<S: ClientStream + 'static>(
    client: S,
    peer: SocketAddr,
    proto: &'static [u8],
    worker: Rc<Worker>,
) {
    let deadline = Rc::new(Cell::new(0));
    let watched = Rc::downgrade(&deadline);
    let deadlines = worker.deadlines.clone();
    let task = tokio::task::spawn_local(async move {
        let connection = Connection {
            deadline,
            client,
            forwarded: Forwarded {
                client_address: peer.ip().to_string().into_bytes().into(),
                proto,
            },
            from_client: Vec::new(),
            out: Vec::new(),
            from_backend: Vec::new(),
        };
        let _ = connection.serve(worker).await;
    });
    deadlines
        .connections
        .borrow_mut()
        .push((watched, task.abort_handle()));
}

async fn accept_tls(
    listener: tokio::net::TcpListener,
    acceptor: Arc<SslAcceptor>,
    worker: Rc<Worker>,
) -> io::Result<()> {
    loop {
        let (stream, peer) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let (acceptor, worker) = (acceptor.clone(), worker.clone());
        tokio::task::spawn_local(async move {
            let Ok(ssl) = Ssl::new(acceptor.context()) else {
                return;
            };
            let Ok(mut tls) = SslStream::new(ssl, stream) else {
                return;
            };
            if Pin::new(&mut tls).accept().await.is_ok() {
                serve(tls, peer, b"https", worker);
            }
        });
    }
}

fn worker(
    listen: SocketAddr,
    tls: Option<(SocketAddr, Arc<SslAcceptor>)>,
    routes: &HashMap<String, SocketAddr>,
) -> io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let worker = Rc::new(Worker {
        routes: routes
            .iter()
            .map(|(host, backend)| (host.as_bytes().into(), *backend))
            .collect(),
        idle: RefCell::new(HashMap::new()),
        deadlines: Rc::new(Deadlines {
            tick: Cell::new(0),
            connections: RefCell::new(Vec::new()),
        }),
    });
    tokio::task::LocalSet::new().block_on(&runtime, async move {
        let deadlines = worker.deadlines.clone();
        tokio::task::spawn_local(async move {
            if let Err(e) = deadlines.sweep().await {
                eprintln!("h1-floor: the deadlines' clock stopped: {e}");
            }
        });
        let listener = tokio::net::TcpListener::from_std(reuse_port_listener(listen)?)?;
        if let Some((address, acceptor)) = tls {
            let listener = tokio::net::TcpListener::from_std(reuse_port_listener(address)?)?;
            let worker = worker.clone();
            tokio::task::spawn_local(async move {
                if let Err(e) = accept_tls(listener, acceptor, worker).await {
                    eprintln!("h1-floor: TLS listener stopped: {e}");
                }
            });
        }
        loop {
            let (stream, peer) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            serve(stream, peer, b"http", worker.clone());
        }
    })
}

fn main() {
    let options = floor_options::from_command_line("h1-floor");
    let (listen, tls, routes) = (options.listen, options.tls, Arc::new(options.routes));
    floor_options::run_workers("h1-floor", options.threads, move || {
        worker(listen, tls.clone(), &routes)
    });
}
