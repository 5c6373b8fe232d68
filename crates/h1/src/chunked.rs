//! Chunked bodies, read strictly and written anew: sizes as bare lowercase hex, extensions
//! dropped, every line ending in CRLF. What the next hop reads is then the one form every
//! parser agrees on, whatever spelling the sender chose (the HTTP Garden's chunk-extension
//! and line-ending findings are all disagreements over spellings this never forwards).

/// Why a chunked body is refused: the connection it came on cannot be trusted further.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkedError {
    /// A size that is not 1–16 hex digits.
    BadSize,
    /// A byte that has no place in a chunk line (a control byte, a bare LF or CR).
    BadLine,
    /// Data not followed by CRLF: the size did not match the data.
    BadDataEnd,
    /// A trailer line that is not `name: value`, or trailers past their limit.
    BadTrailer,
    /// A chunk extension past its limit.
    ExtensionTooLong,
}

/// What one call consumed and whether the body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reframed {
    /// Bytes of the input that belonged to the body (the rest is the next message's).
    pub consumed: usize,
    /// The last chunk and the trailer section were read.
    pub done: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    SizeStart,
    Size,
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerStart,
    TrailerName,
    TrailerValue,
    TrailerLf,
    EndLf,
    Done,
}

const MAX_EXTENSION_BYTES: usize = 1024;
const MAX_TRAILER_BYTES: usize = 8 * 1024;

/// Reads a chunked body as it arrives, in any split, and writes its canonical form.
#[derive(Debug, Clone)]
pub struct ChunkedReframer {
    state: State,
    size: u64,
    digits: u8,
    extension_bytes: usize,
    trailer_bytes: usize,
    /// Write the data alone (for an HTTP/1.0 reader, which knows no chunked coding).
    data_only: bool,
}

impl Default for ChunkedReframer {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedReframer {
    /// A reframer at the start of a body.
    pub fn new() -> Self {
        ChunkedReframer {
            state: State::SizeStart,
            size: 0,
            digits: 0,
            extension_bytes: 0,
            trailer_bytes: 0,
            data_only: false,
        }
    }

    /// A reframer that writes the body's data alone, without chunk lines or trailers: the
    /// body for a reader the connection's close will tell where it ends.
    pub fn dechunking() -> Self {
        ChunkedReframer {
            data_only: true,
            ..Self::new()
        }
    }

    fn framing(&self, bytes: &[u8], out: &mut Vec<u8>) {
        if !self.data_only {
            out.extend_from_slice(bytes);
        }
    }

    /// Whether the whole body has been read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Reads from `input` as far as the body goes, appending its canonical form to `out`.
    pub fn reframe(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<Reframed, ChunkedError> {
        let mut at = 0;
        while at < input.len() && self.state != State::Done {
            if self.state == State::Data {
                // What is left of the input, or of the chunk if less: never `at + size`,
                // which a 16-digit size overflows.
                let take =
                    at + (input.len() - at).min(usize::try_from(self.size).unwrap_or(usize::MAX));
                out.extend_from_slice(&input[at..take]);
                self.size -= (take - at) as u64;
                at = take;
                if self.size == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            self.step(input[at], out)?;
            at += 1;
        }
        Ok(Reframed {
            consumed: at,
            done: self.state == State::Done,
        })
    }

    fn step(&mut self, byte: u8, out: &mut Vec<u8>) -> Result<(), ChunkedError> {
        use State::*;
        self.state = match (self.state, byte) {
            (SizeStart | Size, _) if hex_value(byte).is_some() => {
                if self.digits == 16 {
                    return Err(ChunkedError::BadSize);
                }
                self.digits += 1;
                self.size = self.size << 4 | u64::from(hex_value(byte).unwrap_or(0));
                Size
            }
            (SizeStart, _) => return Err(ChunkedError::BadSize),
            (Size, b';') => Extension,
            (Size | Extension, b'\r') => SizeLf,
            (Size, _) => return Err(ChunkedError::BadSize),
            (Extension, _) if is_line_byte(byte) => {
                self.extension_bytes += 1;
                if self.extension_bytes > MAX_EXTENSION_BYTES {
                    return Err(ChunkedError::ExtensionTooLong);
                }
                Extension
            }
            (SizeLf, b'\n') => {
                if !self.data_only {
                    write_hex(self.size, out);
                }
                self.framing(b"\r\n", out);
                self.digits = 0;
                self.extension_bytes = 0;
                if self.size == 0 {
                    TrailerStart
                } else {
                    Data
                }
            }
            (DataCr, b'\r') => DataLf,
            (DataCr, _) => return Err(ChunkedError::BadDataEnd),
            (DataLf, b'\n') => {
                self.framing(b"\r\n", out);
                SizeStart
            }
            (DataLf, _) => return Err(ChunkedError::BadDataEnd),
            (TrailerStart, b'\r') => EndLf,
            (TrailerStart | TrailerName, _) if is_token_byte(byte) => {
                self.trailer_byte(byte, out)?;
                TrailerName
            }
            (TrailerName, b':') => {
                self.trailer_byte(byte, out)?;
                TrailerValue
            }
            (TrailerValue, b'\r') => TrailerLf,
            (TrailerValue, _) if is_line_byte(byte) => {
                self.trailer_byte(byte, out)?;
                TrailerValue
            }
            (TrailerLf, b'\n') => {
                self.framing(b"\r\n", out);
                TrailerStart
            }
            (TrailerStart | TrailerName | TrailerValue | TrailerLf, _) => {
                return Err(ChunkedError::BadTrailer)
            }
            (EndLf, b'\n') => {
                self.framing(b"\r\n", out);
                Done
            }
            _ => return Err(ChunkedError::BadLine),
        };
        Ok(())
    }

    fn trailer_byte(&mut self, byte: u8, out: &mut Vec<u8>) -> Result<(), ChunkedError> {
        self.trailer_bytes += 1;
        if self.trailer_bytes > MAX_TRAILER_BYTES {
            return Err(ChunkedError::BadTrailer);
        }
        self.framing(&[byte], out);
        Ok(())
    }
}

fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

/// Writes the line that starts a chunk of `size` bytes (its size in bare lowercase hex,
/// CRLF) into `out`: the one spelling every reader agrees on.
pub fn write_chunk_size(out: &mut Vec<u8>, size: u64) {
    write_hex(size, out);
    out.extend_from_slice(b"\r\n");
}

fn write_hex(value: u64, out: &mut Vec<u8>) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let digits = ((64 - value.leading_zeros()).max(1) as usize).div_ceil(4);
    for shift in (0..digits).rev() {
        out.push(DIGITS[(value >> (shift * 4) & 0xf) as usize]);
    }
}

/// A byte of a chunk extension or a trailer value: visible ASCII, space, tab, obs-text.
fn is_line_byte(byte: u8) -> bool {
    matches!(byte, b'\t' | b' '..=b'~' | 0x80..=0xff)
}

fn is_token_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reframe_all(input: &[u8]) -> Result<(Vec<u8>, usize), ChunkedError> {
        let mut reframer = ChunkedReframer::new();
        let mut out = Vec::new();
        let read = reframer.reframe(input, &mut out)?;
        assert!(read.done, "not done: {:?}", String::from_utf8_lossy(input));
        Ok((out, read.consumed))
    }

    #[test]
    fn sizes_and_extensions_are_written_anew() {
        let input = b"5;name=\"v\"\r\nhello\r\n00A\r\n0123456789\r\n0\r\n\r\nGET /next";
        let (out, consumed) = reframe_all(input).expect("valid");
        assert_eq!(out, b"5\r\nhello\r\na\r\n0123456789\r\n0\r\n\r\n");
        assert_eq!(&input[consumed..], b"GET /next");
    }

    #[test]
    fn any_split_gives_the_same_result() {
        let input = b"5\r\nhello\r\n3;x\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n";
        let (whole, _) = reframe_all(input).expect("valid");
        for split in 1..input.len() {
            let mut reframer = ChunkedReframer::new();
            let mut out = Vec::new();
            let first = reframer.reframe(&input[..split], &mut out).expect("valid");
            assert_eq!(first.consumed, split);
            let second = reframer.reframe(&input[split..], &mut out).expect("valid");
            assert!(second.done);
            assert_eq!(out, whole, "split at {split}");
        }
        assert_eq!(whole, b"5\r\nhello\r\n3\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n");
    }

    #[test]
    fn ambiguous_spellings_are_refused() {
        for (input, expected) in [
            (&b"0x5\r\nhello\r\n0\r\n\r\n"[..], ChunkedError::BadSize),
            (b"-5\r\nhello\r\n0\r\n\r\n", ChunkedError::BadSize),
            (
                b"10000000000000005\r\nhello\r\n0\r\n\r\n",
                ChunkedError::BadSize,
            ),
            (b"5 \r\nhello\r\n0\r\n\r\n", ChunkedError::BadSize),
            (b"3\r\nhello\r\n0\r\n\r\n", ChunkedError::BadDataEnd),
            (b"5;\nxx\r\nhello\r\n0\r\n\r\n", ChunkedError::BadLine),
            (b"5\nhello\r\n0\r\n\r\n", ChunkedError::BadSize),
            (b"5\r\nhello\n0\r\n\r\n", ChunkedError::BadDataEnd),
            (b"0\r\nX : y\r\n\r\n", ChunkedError::BadTrailer),
            (b"0\r\n\n", ChunkedError::BadTrailer),
        ] {
            assert_eq!(
                reframe_all(input).map(|_| ()),
                Err(expected),
                "{}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn the_largest_size_is_data_to_read_not_an_overflow() {
        // Found by fuzz/h1_request: a size of u64::MAX overflowed the data step's end.
        let mut reframer = ChunkedReframer::new();
        let mut out = Vec::new();
        let read = reframer
            .reframe(b"FFFFFFFFFFFFFFFF;x\r\nsome data", &mut out)
            .expect("a valid start");
        assert_eq!((read.consumed, read.done), (29, false));
        assert_eq!(out, b"ffffffffffffffff\r\nsome data");
    }

    #[test]
    fn dechunking_keeps_the_data_alone() {
        let mut reframer = ChunkedReframer::dechunking();
        let mut out = Vec::new();
        let read = reframer
            .reframe(b"5;x\r\nhello\r\n1\r\n!\r\n0\r\nX-Sum: 1\r\n\r\n", &mut out)
            .expect("valid");
        assert!(read.done);
        assert_eq!(out, b"hello!");
    }

    #[test]
    fn hex_is_written_without_leading_zeros() {
        for value in [0u64, 1, 15, 16, 255, 4096, u64::MAX] {
            let mut out = Vec::new();
            write_hex(value, &mut out);
            assert_eq!(String::from_utf8(out).expect("ascii"), format!("{value:x}"));
        }
    }
}
