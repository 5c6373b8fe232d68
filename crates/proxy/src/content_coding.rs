//! The content codings answers are compressed with (`stage::compress`): the negotiation
//! of `Accept-Encoding`, and a streaming encoder per coding, bounded in number.
//!
//! Each stream's encoder holds a window (gzip 256 KiB, brotli and zstd 256 KiB at these
//! window sizes): at most [`MAX_STREAMS`] compress at once, past which answers go
//! uncompressed (`switchyard_compress_total{result="busy"}`).

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;

use crate::metrics;

/// Answers compressed at once, at most.
pub(crate) const MAX_STREAMS: usize = 1024;
/// Levels, chosen by measurement (bench/compress.py): the CDNs' defaults, each within a
/// few percent of its coding's ratio at twice the CPU.
const GZIP_LEVEL: u32 = 5;
const BROTLI_QUALITY: u32 = 4;
const BROTLI_WINDOW_LOG: u32 = 18;
const ZSTD_LEVEL: i32 = 3;
const ZSTD_WINDOW_LOG: u32 = 18;

static STREAMS: AtomicUsize = AtomicUsize::new(0);

/// A content coding the router compresses with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Coding {
    Zstd,
    Brotli,
    Gzip,
}

impl Coding {
    /// In the router's order of preference, for clients that like several equally.
    pub(crate) const ALL: [Coding; 3] = [Coding::Zstd, Coding::Brotli, Coding::Gzip];

    pub(crate) fn token(self) -> &'static str {
        match self {
            Self::Zstd => "zstd",
            Self::Brotli => "br",
            Self::Gzip => "gzip",
        }
    }
}

/// The coding `Accept-Encoding` values prefer, if the client accepts one of ours: the
/// highest q-value, ties to the router's order; `*` stands for those not named. Read as
/// bytes, token by token (as `str` pieces split, trimmed and parsed as floats, the
/// negotiation cost more than the rest of the compression stage on a small answer).
pub(crate) fn negotiate<'a>(values: impl Iterator<Item = &'a [u8]>) -> Option<Coding> {
    let mut q = [None::<u16>; 3];
    let mut any = None::<u16>;
    for item in values.flat_map(|value| value.split(|&b| b == b',')) {
        let mut parts = item.split(|&b| b == b';');
        let token = parts.next().unwrap_or_default().trim_ascii();
        let weight = parts
            .find_map(|parameter| {
                let (name, value) = split_once(parameter, b'=')?;
                (name.trim_ascii().eq_ignore_ascii_case(b"q")).then(|| qvalue(value.trim_ascii()))
            })
            .unwrap_or(Some(1000));
        let Some(weight) = weight else { continue };
        let coding = match token.len() {
            1 if token == b"*" => {
                any = Some(weight);
                continue;
            }
            2 if token.eq_ignore_ascii_case(b"br") => Coding::Brotli,
            4 if token.eq_ignore_ascii_case(b"zstd") => Coding::Zstd,
            4 if token.eq_ignore_ascii_case(b"gzip") => Coding::Gzip,
            6 if token.eq_ignore_ascii_case(b"x-gzip") => Coding::Gzip,
            _ => continue,
        };
        q[coding as usize] = Some(weight);
    }
    let mut best: Option<(Coding, u16)> = None;
    for (i, coding) in Coding::ALL.iter().enumerate() {
        let weight = q[i].or(any).unwrap_or(0);
        if weight > 0 && best.is_none_or(|(_, b)| weight > b) {
            best = Some((*coding, weight));
        }
    }
    best.map(|(coding, _)| coding)
}

fn split_once(bytes: &[u8], separator: u8) -> Option<(&[u8], &[u8])> {
    let at = bytes.iter().position(|&b| b == separator)?;
    Some((&bytes[..at], &bytes[at + 1..]))
}

/// A q-value in thousandths (RFC 9110 §12.4.2: `0`, `1`, with up to three decimals), `None`
/// when malformed.
fn qvalue(text: &[u8]) -> Option<u16> {
    let (&whole, rest) = text.split_first()?;
    let decimals = match rest {
        [] => &[][..],
        [b'.', decimals @ ..] if decimals.len() <= 3 => decimals,
        _ => return None,
    };
    let mut thousandths: u16 = 0;
    for place in 0..3 {
        let digit = match decimals.get(place) {
            Some(digit) if digit.is_ascii_digit() => u16::from(digit - b'0'),
            Some(_) => return None,
            None => 0,
        };
        thousandths = thousandths * 10 + digit;
    }
    match whole {
        b'0' => Some(thousandths),
        b'1' if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// One answer's encoder; its place among [`MAX_STREAMS`] is given back when dropped.
pub(crate) struct Encoder {
    state: Option<State>,
    /// What was fed and not compressed yet ([`Encoder::encode_next`]).
    unencoded: Bytes,
}

enum State {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Brotli(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl Encoder {
    /// An encoder for `coding`, unless [`MAX_STREAMS`] are compressing.
    pub(crate) fn start(coding: Coding) -> Option<Self> {
        if STREAMS.fetch_add(1, Ordering::Relaxed) >= MAX_STREAMS {
            STREAMS.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        // Holds the place from here: dropped on any failure below, it gives it back.
        let mut encoder = Self {
            state: None,
            unencoded: Bytes::new(),
        };
        metrics::COMPRESS_STREAMS.set(STREAMS.load(Ordering::Relaxed) as i64);
        encoder.state = Some(match coding {
            Coding::Gzip => State::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::new(GZIP_LEVEL),
            )),
            Coding::Brotli => State::Brotli(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                4096,
                BROTLI_QUALITY,
                BROTLI_WINDOW_LOG,
            ))),
            Coding::Zstd => {
                let mut zstd = zstd::stream::write::Encoder::new(Vec::new(), ZSTD_LEVEL).ok()?;
                zstd.window_log(ZSTD_WINDOW_LOG).ok()?;
                State::Zstd(zstd)
            }
        });
        Some(encoder)
    }

    /// The compressed form of `data`, flushed: what the client can decode so far.
    pub(crate) fn encode(&mut self, data: &[u8]) -> std::io::Result<Bytes> {
        match self.state.as_mut() {
            None => Ok(Bytes::new()),
            Some(State::Gzip(e)) => written(e, data, true, |e| e.get_mut()),
            Some(State::Brotli(e)) => written(e.as_mut(), data, true, |e| e.get_mut()),
            Some(State::Zstd(e)) => written(e, data, true, |e| e.get_mut()),
        }
    }

    /// Takes `data` to compress piece by piece ([`Encoder::encode_next`]).
    pub(crate) fn feed(&mut self, data: Bytes) {
        self.unencoded = data;
    }

    /// Whether some of what was fed is not compressed yet.
    pub(crate) fn has_unencoded(&self) -> bool {
        !self.unencoded.is_empty()
    }

    /// Compresses the next `most` bytes of what was fed: what the encoder put out, flushed
    /// with the last piece (earlier pieces put out only the blocks they completed, so a
    /// large frame costs no more flushes than a small one).
    pub(crate) fn encode_next(&mut self, most: usize) -> std::io::Result<Bytes> {
        let piece = self.unencoded.split_to(most.min(self.unencoded.len()));
        if self.unencoded.is_empty() {
            return self.encode(&piece);
        }
        match self.state.as_mut() {
            None => Ok(Bytes::new()),
            Some(State::Gzip(e)) => written(e, &piece, false, |e| e.get_mut()),
            Some(State::Brotli(e)) => written(e.as_mut(), &piece, false, |e| e.get_mut()),
            Some(State::Zstd(e)) => written(e, &piece, false, |e| e.get_mut()),
        }
    }

    /// The end of the compressed stream; nothing more after it.
    pub(crate) fn finish(&mut self) -> std::io::Result<Bytes> {
        let tail = match self.state.take() {
            None => return Ok(Bytes::new()),
            Some(State::Gzip(e)) => e.finish()?,
            Some(State::Brotli(e)) => e.into_inner(),
            Some(State::Zstd(e)) => e.finish()?,
        };
        Ok(Bytes::from(tail))
    }

    /// Whether the stream was finished.
    pub(crate) fn finished(&self) -> bool {
        self.state.is_none()
    }
}

/// `data` written to `encoder` (flushed when `flush`: what the client can decode so far):
/// the bytes it put in its output since.
fn written<W: Write>(
    encoder: &mut W,
    data: &[u8],
    flush: bool,
    output: impl FnOnce(&mut W) -> &mut Vec<u8>,
) -> std::io::Result<Bytes> {
    encoder.write_all(data)?;
    if flush {
        encoder.flush()?;
    }
    Ok(Bytes::from(std::mem::take(output(encoder))))
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let coding = match &self.state {
            None => "finished",
            Some(State::Gzip(_)) => "gzip",
            Some(State::Brotli(_)) => "br",
            Some(State::Zstd(_)) => "zstd",
        };
        f.debug_struct("Encoder").field("coding", &coding).finish()
    }
}

impl Drop for Encoder {
    fn drop(&mut self) {
        STREAMS.fetch_sub(1, Ordering::Relaxed);
        metrics::COMPRESS_STREAMS.set(STREAMS.load(Ordering::Relaxed) as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn chosen(accept: &str) -> Option<&'static str> {
        negotiate(std::iter::once(accept.as_bytes())).map(Coding::token)
    }

    #[test]
    fn the_clients_preference_then_the_routers_order() {
        assert_eq!(chosen("gzip, deflate, br, zstd"), Some("zstd"));
        assert_eq!(chosen("gzip, deflate, br"), Some("br"));
        assert_eq!(chosen("gzip;q=1.0, br;q=0.5"), Some("gzip"));
        assert_eq!(chosen("br;q=0, gzip;q=0.1"), Some("gzip"));
        assert_eq!(chosen("identity"), None);
        assert_eq!(chosen("*"), Some("zstd"));
        assert_eq!(chosen("*;q=0.5, zstd;q=0, br;q=0"), Some("gzip"));
        assert_eq!(chosen("x-gzip"), Some("gzip"));
        assert_eq!(
            chosen("gzip;q=2"),
            None,
            "a malformed q-value is no acceptance"
        );
        assert_eq!(chosen(""), None);
        assert_eq!(
            chosen(" GZIP ; Q=0.25 , br;q=0.250"),
            Some("br"),
            "ties to our order"
        );
        assert_eq!(chosen("gzip;q=0.5, gzip;q=0"), None, "the last says no");
        for malformed in ["1.5", "0.1234", ".5", "0,5", "-0", "1.001", "0.x"] {
            assert_eq!(qvalue(malformed.as_bytes()), None, "{malformed}");
        }
        assert_eq!(qvalue(b"1.000"), Some(1000));
        assert_eq!(qvalue(b"0.05"), Some(50));
    }

    #[test]
    fn a_frame_fed_whole_and_compressed_in_pieces_reads_back_whole() {
        use std::io::Read;
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut encoder = Encoder::start(Coding::Gzip).expect("an encoder");
        encoder.feed(Bytes::from(data.clone()));
        let mut compressed = Vec::new();
        let mut pieces = 0;
        while encoder.has_unencoded() {
            compressed.extend_from_slice(&encoder.encode_next(8 * 1024).expect("encoded"));
            pieces += 1;
        }
        compressed.extend_from_slice(&encoder.finish().expect("finished"));
        assert_eq!(pieces, 13);
        let mut decoded = Vec::new();
        flate2::read::GzDecoder::new(&compressed[..])
            .read_to_end(&mut decoded)
            .expect("gzip");
        assert_eq!(decoded, data);
    }

    #[test]
    fn each_coding_streams_what_its_decoder_reads_back() {
        let text: Vec<u8> = b"<p>a line of a page that compresses well</p>\n".repeat(2000);
        for coding in Coding::ALL {
            let mut encoder = Encoder::start(coding).expect("a place");
            let mut out = Vec::new();
            for piece in text.chunks(7000) {
                let encoded = encoder.encode(piece).expect("encode");
                assert!(!encoded.is_empty(), "{coding:?}: each piece flushed");
                out.extend_from_slice(&encoded);
            }
            out.extend_from_slice(&encoder.finish().expect("finish"));
            assert!(encoder.finished());
            assert!(
                out.len() * 10 < text.len(),
                "{coding:?}: {} bytes",
                out.len()
            );
            let mut back = Vec::new();
            match coding {
                Coding::Gzip => {
                    flate2::read::GzDecoder::new(&out[..])
                        .read_to_end(&mut back)
                        .expect("gunzip");
                }
                Coding::Brotli => {
                    brotli::Decompressor::new(&out[..], 4096)
                        .read_to_end(&mut back)
                        .expect("unbrotli");
                }
                Coding::Zstd => back = zstd::stream::decode_all(&out[..]).expect("unzstd"),
            }
            assert_eq!(back, text, "{coding:?}");
        }
    }
}
