//! The wire format between routers and `logd`, also the format of the router's on-disk
//! spool: a batch is one frame, acknowledged by one ack frame.
//!
//! ```text
//! batch: "SYLB" | sender u64 | seq u64 | length u32 | crc32 u32 | payload (length bytes)
//! ack:   "SYLA" | sender u64 | seq u64 | status u8 (0 stored, 1 refused)
//! payload: repeated { app length u8 | app | lines length u32 | lines }
//! ```
//! Integers are big-endian. Lines are newline-terminated access-log records of that app, so
//! `logd` appends each block with one write and never parses JSON. `(sender, seq)` names a
//! batch: `sender` is random per router process and `seq` counts up from 1, so `logd` can
//! recognise a batch it already stored when a router sends it again.

use std::io::{self, Read, Write};

/// Largest payload of a batch: the size of the article's packets.
pub const MAX_BATCH_BYTES: usize = 64 * 1024;

const BATCH_MAGIC: &[u8; 4] = b"SYLB";
const ACK_MAGIC: &[u8; 4] = b"SYLA";
/// Bytes before a batch's payload.
pub const BATCH_HEADER_BYTES: usize = 4 + 8 + 8 + 4 + 4;
/// Bytes of an ack.
pub const ACK_BYTES: usize = 4 + 8 + 8 + 1;
/// Longest app name a block can carry (the model's limit is lower).
pub const MAX_APP_BYTES: usize = u8::MAX as usize;

/// Names a batch across retries and restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BatchId {
    /// Random per router process.
    pub sender: u64,
    /// 1, 2, 3… within a sender.
    pub seq: u64,
}

/// One encoded batch, ready to send or spool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Its name.
    pub id: BatchId,
    /// Header and payload, exactly as on the wire.
    pub bytes: Vec<u8>,
    /// Access-log lines it carries.
    pub lines: u32,
}

/// What a receiver made of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckStatus {
    /// Written (and synced as the receiver's policy says), or already stored before.
    Stored,
    /// Malformed; the sender must not send it again.
    Refused,
}

/// A decoded ack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// The batch it answers.
    pub id: BatchId,
    /// The outcome.
    pub status: AckStatus,
}

/// Why bytes are not a frame.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The stream or file failed or ended.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The bytes are not this protocol, or were damaged.
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
}

/// Accumulates access-log lines by app into one batch's payload.
#[derive(Debug, Default)]
pub struct BatchBuilder {
    blocks: Vec<(String, Vec<u8>)>,
    payload_bytes: usize,
    lines: u32,
}

impl BatchBuilder {
    /// Payload bytes if `app`'s `line` (newline excluded) were added.
    pub fn size_with(&self, app: &str, line: &[u8]) -> usize {
        let block_header = if self.blocks.iter().any(|(a, _)| a == app) {
            0
        } else {
            1 + app.len() + 4
        };
        self.payload_bytes + block_header + line.len() + 1
    }

    /// Adds one line. The caller checks [`size_with`](Self::size_with) against its limit
    /// first; an app name longer than [`MAX_APP_BYTES`] is cut (it cannot be a real app).
    pub fn push(&mut self, app: &str, line: &[u8]) {
        let app = truncate(app, MAX_APP_BYTES);
        self.payload_bytes = self.size_with(app, line);
        self.lines += 1;
        // Few apps per batch in practice; a linear scan beats hashing for that.
        let block = match self.blocks.iter().position(|(a, _)| a == app) {
            Some(i) => &mut self.blocks[i].1,
            None => {
                self.blocks.push((app.to_string(), Vec::new()));
                let last = self.blocks.len() - 1;
                &mut self.blocks[last].1
            }
        };
        block.extend_from_slice(line);
        block.push(b'\n');
    }

    /// Lines added since the last [`finish`](Self::finish).
    pub fn lines(&self) -> u32 {
        self.lines
    }

    /// Encodes the batch as `id` and empties the builder.
    pub fn finish(&mut self, id: BatchId) -> Frame {
        let mut payload = Vec::with_capacity(self.payload_bytes);
        for (app, lines) in self.blocks.drain(..) {
            payload.push(app.len() as u8);
            payload.extend_from_slice(app.as_bytes());
            payload.extend_from_slice(&(lines.len() as u32).to_be_bytes());
            payload.extend_from_slice(&lines);
        }
        let lines = std::mem::take(&mut self.lines);
        self.payload_bytes = 0;
        Frame {
            id,
            bytes: encode_batch(id, &payload),
            lines,
        }
    }
}

fn truncate(app: &str, max: usize) -> &str {
    if app.len() <= max {
        return app;
    }
    let mut end = max;
    while !app.is_char_boundary(end) {
        end -= 1;
    }
    &app[..end]
}

/// Header and payload of a batch.
pub fn encode_batch(id: BatchId, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(BATCH_HEADER_BYTES + payload.len());
    bytes.extend_from_slice(BATCH_MAGIC);
    bytes.extend_from_slice(&id.sender.to_be_bytes());
    bytes.extend_from_slice(&id.seq.to_be_bytes());
    bytes.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    bytes.extend_from_slice(&crc32fast::hash(payload).to_be_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// A batch's header, parsed: who, which, how long, and the payload's checksum.
#[derive(Debug, Clone, Copy)]
pub struct BatchHeader {
    /// The batch's name.
    pub id: BatchId,
    /// Payload bytes that follow, at most [`MAX_BATCH_BYTES`].
    pub length: usize,
    crc: u32,
}

impl BatchHeader {
    /// Parses a header; a wrong magic or an oversized length means the stream cannot be
    /// framed any further.
    pub fn parse(header: &[u8; BATCH_HEADER_BYTES]) -> Result<Self, FrameError> {
        if &header[..4] != BATCH_MAGIC {
            return Err(FrameError::Malformed("not a batch"));
        }
        let length = u32_at(header, 20) as usize;
        if length > MAX_BATCH_BYTES {
            return Err(FrameError::Malformed("batch larger than 64 KiB"));
        }
        Ok(Self {
            id: BatchId {
                sender: u64_at(header, 4),
                seq: u64_at(header, 12),
            },
            length,
            crc: u32_at(header, 24),
        })
    }

    /// Whether `payload` is what the sender sent.
    pub fn matches(&self, payload: &[u8]) -> bool {
        crc32fast::hash(payload) == self.crc
    }
}

/// Reads one batch: its id and payload, checked against its CRC. `Ok(None)` at a clean end
/// of stream (between frames).
pub fn read_batch(input: &mut impl Read) -> Result<Option<(BatchId, Vec<u8>)>, FrameError> {
    let mut header = [0u8; BATCH_HEADER_BYTES];
    if !read_exact_or_end(input, &mut header)? {
        return Ok(None);
    }
    let header = BatchHeader::parse(&header)?;
    let mut payload = vec![0; header.length];
    input.read_exact(&mut payload)?;
    if !header.matches(&payload) {
        return Err(FrameError::Malformed("checksum mismatch"));
    }
    Ok(Some((header.id, payload)))
}

/// The blocks of a payload: `(app, lines)` in order.
pub fn blocks(payload: &[u8]) -> Result<Vec<(&str, &[u8])>, FrameError> {
    let mut blocks = Vec::new();
    let mut rest = payload;
    while let Some((&app_len, after)) = rest.split_first() {
        let app_len = usize::from(app_len);
        if after.len() < app_len + 4 {
            return Err(FrameError::Malformed("truncated block header"));
        }
        let app = std::str::from_utf8(&after[..app_len])
            .map_err(|_| FrameError::Malformed("app name is not UTF-8"))?;
        let lines_len = u32_at(after, app_len) as usize;
        let lines_start = app_len + 4;
        let lines = after
            .get(lines_start..lines_start + lines_len)
            .ok_or(FrameError::Malformed("truncated block"))?;
        if lines.last().is_some_and(|&b| b != b'\n') {
            return Err(FrameError::Malformed("a block's last line has no newline"));
        }
        blocks.push((app, lines));
        rest = &after[lines_start + lines_len..];
    }
    Ok(blocks)
}

/// Writes an ack.
pub fn write_ack(output: &mut impl Write, ack: Ack) -> io::Result<()> {
    output.write_all(&encode_ack(ack))
}

/// An ack's bytes.
pub fn encode_ack(ack: Ack) -> [u8; ACK_BYTES] {
    let mut bytes = [0u8; ACK_BYTES];
    bytes[..4].copy_from_slice(ACK_MAGIC);
    bytes[4..12].copy_from_slice(&ack.id.sender.to_be_bytes());
    bytes[12..20].copy_from_slice(&ack.id.seq.to_be_bytes());
    bytes[20] = match ack.status {
        AckStatus::Stored => 0,
        AckStatus::Refused => 1,
    };
    bytes
}

/// Reads an ack.
pub fn read_ack(input: &mut impl Read) -> Result<Ack, FrameError> {
    let mut bytes = [0u8; ACK_BYTES];
    input.read_exact(&mut bytes)?;
    if &bytes[..4] != ACK_MAGIC {
        return Err(FrameError::Malformed("not an ack"));
    }
    let status = match bytes[20] {
        0 => AckStatus::Stored,
        1 => AckStatus::Refused,
        _ => return Err(FrameError::Malformed("unknown ack status")),
    };
    Ok(Ack {
        id: BatchId {
            sender: u64_at(&bytes, 4),
            seq: u64_at(&bytes, 12),
        },
        status,
    })
}

/// Lines in a payload (for counting what a spooled frame holds).
pub fn count_lines(payload: &[u8]) -> u32 {
    blocks(payload).map_or(0, |blocks| {
        blocks
            .iter()
            .map(|(_, lines)| lines.iter().filter(|&&b| b == b'\n').count() as u32)
            .sum()
    })
}

/// Fills `buffer`, or returns `false` if the input ended before its first byte.
fn read_exact_or_end(input: &mut impl Read, buffer: &mut [u8]) -> io::Result<bool> {
    let mut filled = 0;
    while filled < buffer.len() {
        match input.read(&mut buffer[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(word)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_be_bytes(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_round_trips_with_its_lines_grouped_by_app() {
        let mut builder = BatchBuilder::default();
        builder.push("shop", br#"{"n":1}"#);
        builder.push("blog", br#"{"n":2}"#);
        builder.push("shop", br#"{"n":3}"#);
        let expected_size = builder.size_with("shop", b"");
        let id = BatchId { sender: 7, seq: 42 };
        let frame = builder.finish(id);
        assert_eq!(frame.lines, 3);
        assert_eq!(frame.bytes.len(), BATCH_HEADER_BYTES + expected_size - 1);

        let (read_id, payload) = read_batch(&mut frame.bytes.as_slice())
            .expect("valid")
            .expect("one frame");
        assert_eq!(read_id, id);
        assert_eq!(
            blocks(&payload).expect("valid blocks"),
            vec![
                ("shop", &b"{\"n\":1}\n{\"n\":3}\n"[..]),
                ("blog", &b"{\"n\":2}\n"[..])
            ]
        );
        assert_eq!(count_lines(&payload), 3);
        assert_eq!(builder.lines(), 0, "finish empties the builder");
    }

    #[test]
    fn damaged_frames_are_refused_not_misread() {
        let mut builder = BatchBuilder::default();
        builder.push("shop", b"line");
        let frame = builder.finish(BatchId { sender: 1, seq: 1 });
        let mut flipped = frame.bytes.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 0x20;
        assert!(matches!(
            read_batch(&mut flipped.as_slice()),
            Err(FrameError::Malformed("checksum mismatch"))
        ));
        let truncated = &frame.bytes[..frame.bytes.len() - 1];
        assert!(matches!(
            read_batch(&mut &truncated[..]),
            Err(FrameError::Io(_))
        ));
        let mut huge = frame.bytes.clone();
        huge[20..24].copy_from_slice(&(MAX_BATCH_BYTES as u32 + 1).to_be_bytes());
        assert!(read_batch(&mut huge.as_slice()).is_err());
        assert!(matches!(read_batch(&mut &b""[..]), Ok(None)));
        assert!(blocks(&[3, b'a']).is_err());
    }

    #[test]
    fn acks_round_trip() {
        let ack = Ack {
            id: BatchId { sender: 9, seq: 3 },
            status: AckStatus::Refused,
        };
        let mut bytes = Vec::new();
        write_ack(&mut bytes, ack).expect("write");
        assert_eq!(read_ack(&mut bytes.as_slice()).expect("read"), ack);
    }
}
