//! The few header fields that decide how a message is framed and whether a connection
//! persists, read strictly: where two readers could take one of them two ways, the message
//! is refused rather than forwarded.

use httparse::Header;

/// What a message's `Connection` fields say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Connection {
    /// `close`: the sender ends the connection after this message.
    pub close: bool,
    /// `keep-alive`: an HTTP/1.0 sender asks to keep the connection.
    pub keep_alive: bool,
    /// `upgrade`: the `Upgrade` field is meant for this hop.
    pub upgrade: bool,
    /// Other names: fields that are hop-by-hop for this message only.
    pub names_fields: bool,
}

impl Connection {
    pub(crate) fn read(headers: &[Header<'_>]) -> Self {
        Self::from_values(connection_values(headers))
    }

    /// What the values of a message's `Connection` fields say, wherever they were read.
    #[inline]
    pub(crate) fn from_values<'v>(values: impl Iterator<Item = &'v [u8]>) -> Self {
        let mut connection = Connection::default();
        // Two plain loops, not a flat_map: this runs for every head, and flat_map's state
        // cost 1% of a proxied request's instructions (callgrind, h1-floor).
        for value in values {
            connection.note(value);
        }
        connection
    }

    /// Notes what one `Connection` field's value says.
    fn note(&mut self, value: &[u8]) {
        for token in tokens(value) {
            if token.eq_ignore_ascii_case(b"close") {
                self.close = true;
            } else if token.eq_ignore_ascii_case(b"keep-alive") {
                self.keep_alive = true;
            } else if token.eq_ignore_ascii_case(b"upgrade") {
                self.upgrade = true;
            } else {
                self.names_fields = true;
            }
        }
    }

    /// Whether a connection whose peer sent this in a message of HTTP/1.`minor_version`
    /// stays open after the exchange (RFC 9112 §9.3).
    pub fn persists(&self, minor_version: u8) -> bool {
        !self.close && (minor_version >= 1 || self.keep_alive)
    }
}

/// The comma-separated elements of a list field, trimmed, empty ones skipped.
pub(crate) fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(trim)
        .filter(|token| !token.is_empty())
}

pub(crate) fn trim(mut bytes: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = bytes {
        bytes = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = bytes {
        bytes = rest;
    }
    bytes
}

/// Why a message's length cannot be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LengthError {
    /// A Content-Length that is not 1*DIGIT within 64 bits, or two that differ.
    BadContentLength,
    /// Transfer codings not ending in exactly one `chunked`.
    BadCodings,
}

/// The framing fields of a message, before the rules of requests and responses apply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Framing {
    pub(crate) content_length: Option<u64>,
    /// Some `Transfer-Encoding` was sent.
    pub(crate) transfer_encoding: bool,
    /// The codings end in one `chunked`, the only one.
    pub(crate) chunked_last: bool,
    /// Codings other than `chunked` and `identity` (to be kept, in order, for the next hop).
    pub(crate) other_codings: bool,
}

/// Reads Content-Length and Transfer-Encoding. Equal Content-Length values, on several
/// lines or in one list, are one length (RFC 9110 §8.6); anything else about it is an error
/// for the caller to refuse.
#[cfg(test)]
pub(crate) fn framing(headers: &[Header<'_>]) -> Result<Framing, LengthError> {
    framing_and_connection(headers).0
}

/// [`framing`] and [`Connection::read`] in one walk over the fields: both run for every
/// head, and each walk of its own cost a tenth of the codec's work (callgrind).
pub(crate) fn framing_and_connection(
    headers: &[Header<'_>],
) -> (Result<Framing, LengthError>, Connection) {
    let mut connection = Connection::default();
    match framing_noting(headers, &mut connection) {
        Ok(framing) => (Ok(framing), connection),
        // The walk stopped at the error: the rest of the Connection fields are read apart.
        Err(error) => (Err(error), Connection::read(headers)),
    }
}

fn framing_noting(
    headers: &[Header<'_>],
    connection: &mut Connection,
) -> Result<Framing, LengthError> {
    let mut framing = Framing::default();
    let mut chunked_seen = 0;
    let mut last_coding_chunked = false;
    for header in headers {
        let name = header.name.as_bytes();
        if name.len() == 10 && name.eq_ignore_ascii_case(b"connection") {
            connection.note(header.value);
        } else if name.eq_ignore_ascii_case(b"content-length") {
            let length = content_length_value(header.value).ok_or(LengthError::BadContentLength)?;
            match framing.content_length {
                Some(seen) if seen != length => return Err(LengthError::BadContentLength),
                _ => framing.content_length = Some(length),
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            framing.transfer_encoding = true;
            for coding in tokens(header.value) {
                if coding.eq_ignore_ascii_case(b"chunked") {
                    chunked_seen += 1;
                    last_coding_chunked = true;
                } else {
                    last_coding_chunked = false;
                    if !coding.eq_ignore_ascii_case(b"identity") {
                        framing.other_codings = true;
                    }
                }
            }
        }
    }
    if framing.transfer_encoding {
        framing.chunked_last = chunked_seen == 1 && last_coding_chunked;
        if chunked_seen > 1 {
            return Err(LengthError::BadCodings);
        }
    }
    Ok(framing)
}

/// The length one Content-Length field gives, as the codec reads it: one decimal, or a list
/// of equal ones (RFC 9110 §8.6); `None` for anything else. Everything past the codec that
/// reads a length reads it with this, so no two places can take one value two ways.
pub fn content_length_value(value: &[u8]) -> Option<u64> {
    let mut elements = value.split(|&b| b == b',').map(trim);
    let length = parse_decimal(elements.next()?)?;
    elements
        .all(|element| parse_decimal(element) == Some(length))
        .then_some(length)
}

/// 1*DIGIT, at most 19 of them (no sign, no spaces, no hex): what every reader takes the
/// same way.
pub(crate) fn parse_decimal(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 19 {
        return None;
    }
    value.iter().try_fold(0u64, |total, &b| {
        b.is_ascii_digit().then(|| total * 10 + u64::from(b - b'0'))
    })
}

/// Fields that belong to one hop and are never forwarded as received (RFC 9110 §7.6.1);
/// the framing fields are in the list because they are written anew for the next hop.
pub(crate) fn is_hop_by_hop(name: &[u8]) -> bool {
    // Sorted by how often they appear; each check is a length test first.
    const HOP_BY_HOP: [&str; 9] = [
        "connection",
        "keep-alive",
        "content-length",
        "transfer-encoding",
        "upgrade",
        "te",
        "trailer",
        "proxy-connection",
        "http2-settings",
    ];
    HOP_BY_HOP
        .iter()
        .any(|hop| hop.len() == name.len() && hop.as_bytes().eq_ignore_ascii_case(name))
}

/// The values of the `Connection` fields among `headers`.
pub(crate) fn connection_values<'v>(headers: &'v [Header<'_>]) -> impl Iterator<Item = &'v [u8]> {
    headers
        .iter()
        .filter(|header| header.name.eq_ignore_ascii_case("connection"))
        .map(|header| header.value)
}

/// Whether a field named `name` goes on to the next hop: not a hop-by-hop field, nor one
/// the message's `Connection` fields list (`connection` says whether they list any, so
/// that `connection_values` is only walked then). The framing fields are hop-by-hop and
/// written anew, whatever `Connection` says, and Host is never dropped: dropping a
/// Content-Length named there would leave the next hop reading the body as the next
/// request.
pub(crate) fn forwarded<'v>(
    name: &[u8],
    connection: &Connection,
    mut connection_values: impl Iterator<Item = &'v [u8]>,
) -> bool {
    if is_hop_by_hop(name) {
        return false;
    }
    !(connection.names_fields
        && !name.eq_ignore_ascii_case(b"host")
        && connection_values
            .any(|value| tokens(value).any(|token| token.eq_ignore_ascii_case(name))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'a>(name: &'a str, value: &'a str) -> Header<'a> {
        Header {
            name,
            value: value.as_bytes(),
        }
    }

    #[test]
    fn content_length_is_strict_decimal() {
        assert_eq!(parse_decimal(b"0"), Some(0));
        assert_eq!(parse_decimal(b"18446744073709551"), Some(18446744073709551));
        for bad in [
            &b""[..],
            b"+5",
            b"-1",
            b"0x5",
            b"5 5",
            b"99999999999999999999",
        ] {
            assert_eq!(parse_decimal(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn equal_lengths_are_one_and_different_ones_an_error() {
        let same = [
            header("Content-Length", "5"),
            header("content-length", "5, 5"),
        ];
        assert_eq!(framing(&same).map(|f| f.content_length), Ok(Some(5)));
        let differ = [header("Content-Length", "5, 40")];
        assert_eq!(framing(&differ), Err(LengthError::BadContentLength));
    }

    #[test]
    fn a_length_read_past_the_codec_is_read_as_the_codec_reads_it() {
        for (value, expected) in [
            (&b"5"[..], Some(5)),
            (b"5, 5", Some(5)),
            (b"5,5 ,\t5", Some(5)),
            (b"5, 40", None),
            (b"5,", None),
            (b"", None),
            (b" ", None),
            (b"+5", None),
        ] {
            assert_eq!(content_length_value(value), expected, "{value:?}");
            let fields = [header(
                "Content-Length",
                std::str::from_utf8(value).expect("the cases are ASCII"),
            )];
            let framed = framing(&fields).ok().and_then(|f| f.content_length);
            assert_eq!(framed, expected, "the codec's walk over {value:?}");
        }
    }

    #[test]
    fn the_one_walk_reads_connection_as_its_own_walk_does_even_past_a_bad_length() {
        for fields in [
            vec![
                header("Connection", "close, X-A"),
                header("Content-Length", "5"),
                header("connection", " keep-alive "),
            ],
            vec![
                header("Content-Length", "5, 40"),
                header("Connection", "upgrade"),
            ],
            vec![header("Connectionx", "close"), header("Connectio", "close")],
        ] {
            let (framing, connection) = framing_and_connection(&fields);
            assert_eq!(connection, Connection::read(&fields), "{fields:?}");
            assert_eq!(framing, framing_noting(&fields, &mut Connection::default()));
        }
    }

    #[test]
    fn codings_must_end_in_one_chunked() {
        let ends = |value| framing(&[header("Transfer-Encoding", value)]).map(|f| f.chunked_last);
        assert_eq!(ends("chunked"), Ok(true));
        assert_eq!(ends("identity, CHUNKED"), Ok(true));
        assert_eq!(ends("chunked, identity"), Ok(false));
        assert_eq!(ends("xchunked"), Ok(false));
        assert_eq!(ends("chunked, chunked"), Err(LengthError::BadCodings));
        let split = [
            header("Transfer-Encoding", "gzip"),
            header("Transfer-Encoding", "chunked"),
        ];
        let read = framing(&split).expect("valid");
        assert!(read.chunked_last && read.other_codings);
    }

    #[test]
    fn connection_tokens_and_persistence() {
        let read = Connection::read(&[header("Connection", "Keep-Alive, X-Secret")]);
        assert!(read.keep_alive && read.names_fields && !read.close);
        assert!(read.persists(0));
        assert!(!Connection::default().persists(0));
        assert!(Connection::default().persists(1));
        assert!(!Connection::read(&[header("connection", "close")]).persists(1));
    }

    #[test]
    fn fields_named_in_connection_stay_behind_but_host() {
        let headers = [
            header("Connection", "Content-Length, X-Secret, Host"),
            header("Host", "a"),
        ];
        let connection = Connection::read(&headers);
        let forwarded =
            |name: &str| forwarded(name.as_bytes(), &connection, connection_values(&headers));
        assert!(!forwarded("x-secret"));
        assert!(forwarded("x-other"));
        // Framing is the writer's to write anew; Host is never dropped.
        assert!(!forwarded("Content-Length"));
        assert!(forwarded("host"));
    }
}
