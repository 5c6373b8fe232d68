//! HTTP/2 by prior knowledge on the router's plain listener, written frame by frame so a
//! test can send what an HTTP/2 library would refuse to: malformed requests (RFC 9113
//! §8.2), or streams opened and reset faster than any real client would.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const DATA: u8 = 0;
pub const HEADERS: u8 = 1;
pub const RST_STREAM: u8 = 3;
pub const SETTINGS: u8 = 4;
pub const GOAWAY: u8 = 7;
pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;
/// RST_STREAM / GOAWAY error code a client uses to cancel a stream.
pub const CANCEL: u32 = 0x8;

/// What the router answered on stream 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A response HEADERS frame with this status (0 if not one of the indexed ones).
    Answered(u16),
    /// The stream was reset with this error code.
    Reset(u32),
    /// The connection was shut with this error code.
    GoAway(u32),
    /// Nothing came back.
    Silence,
}

#[derive(Debug, Clone)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    /// The error code of a RST_STREAM or GOAWAY frame.
    pub fn error_code(&self) -> u32 {
        let at = if self.kind == GOAWAY { 4 } else { 0 };
        self.payload
            .get(at..at + 4)
            .map_or(0, |c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
    }
}

pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).expect("small frame");
    let mut out = length.to_be_bytes()[1..].to_vec();
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// RFC 7541 §6.2.2: literal field without indexing, literal name, no Huffman coding.
pub fn field(name: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = vec![0x00];
    for text in [name, value] {
        out.push(
            u8::try_from(text.len())
                .ok()
                .filter(|&n| n < 127)
                .expect("short"),
        );
        out.extend_from_slice(text);
    }
    out
}

pub fn request_block(
    method: &str,
    authority: &str,
    path: &[u8],
    extra: &[(&[u8], &[u8])],
) -> Vec<u8> {
    let mut block = field(b":method", method.as_bytes());
    block.extend(field(b":scheme", b"http"));
    block.extend(field(b":path", path));
    block.extend(field(b":authority", authority.as_bytes()));
    for (name, value) in extra {
        block.extend(field(name, value));
    }
    block
}

/// One client connection; the router's SETTINGS are acknowledged as they arrive.
pub struct Connection {
    stream: TcpStream,
    received: Vec<u8>,
    closed: bool,
}

impl Connection {
    pub fn open(router: SocketAddr) -> Self {
        let stream = TcpStream::connect(router).expect("router accepts");
        stream
            .set_read_timeout(Some(Duration::from_millis(2)))
            .expect("read timeout");
        let mut connection = Self {
            stream,
            received: Vec::new(),
            closed: false,
        };
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        let _ = connection.send(&hello);
        connection
    }

    pub fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// The next frame other than SETTINGS, or None at the deadline or when the router closed.
    /// Whether it closed: `closed()` afterwards.
    pub fn next_frame(&mut self, deadline: Instant) -> Option<Frame> {
        let mut buf = [0u8; 16 * 1024];
        loop {
            while let Some(frame) = self.take_frame() {
                if frame.kind == SETTINGS {
                    if frame.flags & ACK == 0 {
                        let _ = self.send(&self::frame(SETTINGS, ACK, 0, &[]));
                    }
                    continue;
                }
                return Some(frame);
            }
            // One read at least, so a deadline of now still collects what already arrived.
            match self.stream.read(&mut buf) {
                Ok(0) => {
                    self.closed = true;
                    return None;
                }
                Ok(n) => self.received.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if Instant::now() >= deadline {
                        return None;
                    }
                }
                Err(_) => {
                    self.closed = true;
                    return None;
                }
            }
        }
    }

    /// Whether the router closed the connection (seen by `next_frame`).
    pub fn closed(&self) -> bool {
        self.closed
    }

    fn take_frame(&mut self) -> Option<Frame> {
        let r = &self.received;
        if r.len() < 9 {
            return None;
        }
        let length = u32::from_be_bytes([0, r[0], r[1], r[2]]) as usize;
        if r.len() < 9 + length {
            return None;
        }
        let frame = Frame {
            kind: r[3],
            flags: r[4],
            stream: u32::from_be_bytes([r[5], r[6], r[7], r[8]]) & 0x7fff_ffff,
            payload: r[9..9 + length].to_vec(),
        };
        self.received.drain(..9 + length);
        Some(frame)
    }
}

/// Sends the frames of stream 1 on a new connection; reports what came back within 3 s.
pub fn exchange(router: SocketAddr, frames: &[Vec<u8>]) -> Outcome {
    let mut connection = Connection::open(router);
    for f in frames {
        let _ = connection.send(f);
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while let Some(frame) = connection.next_frame(deadline) {
        match frame.kind {
            HEADERS if frame.stream == 1 => {
                // The h2 encoder sends common statuses as static-table indexes.
                let status = match frame.payload.first() {
                    Some(0x88) => 200,
                    Some(0x8c) => 400,
                    Some(0x8d) => 404,
                    Some(0x8e) => 500,
                    _ => 0,
                };
                return Outcome::Answered(status);
            }
            RST_STREAM if frame.stream == 1 => return Outcome::Reset(frame.error_code()),
            GOAWAY => return Outcome::GoAway(frame.error_code()),
            _ => {}
        }
    }
    Outcome::Silence
}
