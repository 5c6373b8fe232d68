//! A backend's response head, read once: its status and where its body ends.

use httparse::{Header, ParserConfig, Status};

use crate::fields::{self, Connection};
use crate::HeaderSlots;

/// How the response's body is framed (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseBody {
    /// No body: an answer to HEAD, a 1xx, 204 or 304 (whatever its fields say).
    None,
    /// Exactly this many bytes follow the head.
    Length(u64),
    /// A chunked body.
    Chunked,
    /// The body runs until the backend closes the connection.
    UntilClose,
}

/// Why a backend's answer cannot be forwarded (the client gets 502).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseError {
    /// Not an HTTP/1.x status line and header section.
    Malformed,
    /// More than [`crate::MAX_HEADERS`] lines.
    HeadTooLarge,
    /// A Content-Length that is not one decimal number.
    BadContentLength,
}

/// A parsed response head, slices of the read buffer.
#[derive(Debug)]
pub struct ResponseHead<'h, 'b> {
    /// The status code.
    pub code: u16,
    /// The reason phrase as sent (may be empty).
    pub reason: &'b str,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    /// The header lines, in order.
    pub headers: &'h [Header<'b>],
    /// Bytes of the head: the body starts there.
    pub head_len: usize,
    /// Where the body ends.
    pub body: ResponseBody,
    /// The response's `Connection` fields.
    pub connection: Connection,
    /// Codings other than chunked to keep for the client (`gzip, chunked`).
    pub other_codings: bool,
}

impl ResponseHead<'_, '_> {
    /// An interim answer (1xx other than 101): the final one follows on the connection.
    pub fn is_interim(&self) -> bool {
        (100..200).contains(&self.code) && self.code != 101
    }

    /// A bodiless answer whose Content-Length tells the size of what a GET would have got
    /// (an answer to HEAD, a 304): the field is kept for the client as sent.
    pub fn announces_length(&self) -> bool {
        self.body == ResponseBody::None && self.code >= 200 && self.code != 204
    }

    /// Whether the backend connection can carry another request once this body is read.
    pub fn keeps_connection(&self) -> bool {
        self.code != 101
            && self.body != ResponseBody::UntilClose
            && self.connection.persists(self.minor_version)
    }
}

/// Parses a response head at the start of `buf`; `answers_head` says whether the request
/// was a HEAD (its answer has no body). `Ok(None)`: more bytes are needed.
pub fn parse_response<'h, 'b>(
    buf: &'b [u8],
    slots: &'h mut HeaderSlots<'b>,
    answers_head: bool,
) -> Result<Option<ResponseHead<'h, 'b>>, ResponseError> {
    let mut response = httparse::Response::new(&mut []);
    let head_len =
        match ParserConfig::default().parse_response_with_uninit_headers(&mut response, buf, slots)
        {
            Ok(Status::Complete(length)) => length,
            Ok(Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(ResponseError::HeadTooLarge),
            Err(_) => return Err(ResponseError::Malformed),
        };
    let (Some(code), Some(minor_version)) = (response.code, response.version) else {
        return Err(ResponseError::Malformed);
    };
    let headers: &'h [Header<'b>] = response.headers;
    let (framing, connection) = fields::framing_and_connection(headers);
    let framing = framing.map_err(|_| ResponseError::BadContentLength);
    let no_body = answers_head || (100..200).contains(&code) || code == 204 || code == 304;
    let (body, other_codings) = match framing {
        _ if no_body => (ResponseBody::None, false),
        // A response may end by closing where a request may not: codings that do not end
        // in chunked, or chunked twice, mean "until close" (RFC 9112 §6.3 item 4).
        Ok(read) if read.transfer_encoding && read.chunked_last => {
            (ResponseBody::Chunked, read.other_codings)
        }
        Ok(read) if read.transfer_encoding => (ResponseBody::UntilClose, false),
        Err(_) if has_transfer_encoding(headers) => (ResponseBody::UntilClose, false),
        Ok(read) => match read.content_length {
            Some(length) => (ResponseBody::Length(length), false),
            None => (ResponseBody::UntilClose, false),
        },
        Err(error) => return Err(error),
    };
    Ok(Some(ResponseHead {
        code,
        reason: response.reason.unwrap_or(""),
        minor_version,
        headers,
        head_len,
        body,
        connection,
        other_codings,
    }))
}

fn has_transfer_encoding(headers: &[Header<'_>]) -> bool {
    headers
        .iter()
        .any(|header| header.name.eq_ignore_ascii_case("transfer-encoding"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header_slots;

    fn body(raw: &[u8], answers_head: bool) -> Result<(ResponseBody, bool), ResponseError> {
        let mut slots = header_slots();
        parse_response(raw, &mut slots, answers_head)
            .map(|head| head.expect("complete"))
            .map(|head| (head.body, head.keeps_connection()))
    }

    #[test]
    fn framing_of_answers() {
        use ResponseBody::*;
        assert_eq!(
            body(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false),
            Ok((Length(2), true))
        );
        assert_eq!(
            body(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", true),
            Ok((None, true))
        );
        assert_eq!(
            body(
                b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
                false
            ),
            Ok((None, true))
        );
        assert_eq!(
            body(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n",
                false
            ),
            Ok((Chunked, true))
        );
        assert_eq!(
            body(b"HTTP/1.1 200 OK\r\n\r\n", false),
            Ok((UntilClose, false))
        );
        assert_eq!(
            body(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", false),
            Ok((UntilClose, false))
        );
        assert_eq!(
            body(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n", false),
            Ok((Length(2), false))
        );
        assert_eq!(
            body(b"HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\n", false),
            Err(ResponseError::BadContentLength)
        );
        assert_eq!(
            body(b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n", false),
            Err(ResponseError::Malformed)
        );
    }

    #[test]
    fn interim_answers_are_told_apart_from_101() {
        let mut slots = header_slots();
        let head = parse_response(b"HTTP/1.1 100 Continue\r\n\r\n", &mut slots, false)
            .expect("valid")
            .expect("complete");
        assert!(head.is_interim());
        let mut slots = header_slots();
        let switched = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n";
        let head = parse_response(switched, &mut slots, false)
            .expect("valid")
            .expect("complete");
        assert!(!head.is_interim() && !head.keeps_connection());
    }
}
