//! A request's fields as the stages on every request's path read them: an HTTP/1.x
//! client's where they were read (the head's bytes and where each field sits in them), or
//! a map (HTTP/2 requests, which hyper's server hands over as one, and requests a stage
//! reads whole). Building a `HeaderMap` for every request (a hash and an insert per field,
//! an allocation for the map) was a tenth of a proxied request's instructions, for the
//! five or six fields the router looks at (callgrind, bench/ENGINE.md); nginx reads a
//! request's fields where they sit too.
//!
//! The WAF, the cache, image resizing, mirroring and limits read a request whole through
//! `http::request::Parts`: on the routes of apps that have them, the map is made from the
//! fields as read (`PlacedFields::to_map`, values sharing the head's bytes) before they run.
//! No request the codec took is known to be refused there (`http` reads names and values
//! as httparse does; fuzz/fuzz_targets/h1_request.rs checks it).

use bytes::Bytes;
use http::{HeaderMap, HeaderName};
use switchyard_h1::{BridgeError, FieldPlace, PlacedFields};

use crate::forwarded;

/// An HTTP/1.x client's fields where it sent them, in its order and spelling, with where
/// the fields every request's stages look for sit.
pub(crate) struct RequestFields {
    placed: PlacedFields,
    known: KnownFields,
}

impl RequestFields {
    /// The fields at `places` in `head`, their known ones noted in one walk.
    #[cfg(test)]
    pub(crate) fn new(head: Bytes, places: &[FieldPlace]) -> Self {
        let mut known = KnownFields::default();
        for (index, &(name_start, name_end, start, end)) in places.iter().enumerate() {
            if let (Some(name), true) = (
                head.get(name_start as usize..name_end as usize),
                start <= end && end as usize <= head.len(),
            ) {
                known.note(index, name, (end - start) as usize);
            }
        }
        Self {
            placed: PlacedFields::new(head, places),
            known,
        }
    }

    /// The fields at `places` in `head`, whose known ones the parse noted as it placed them
    /// (`known`, from the same `places`).
    pub(crate) fn noted(head: Bytes, places: &[FieldPlace], known: KnownFields) -> Self {
        Self {
            placed: PlacedFields::new(head, places),
            known,
        }
    }

    /// The fields, names and values, in the order they were sent.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + Clone {
        self.placed.iter()
    }

    /// The fields where they were read, for the backend's head writer.
    pub(crate) fn placed(&self) -> &PlacedFields {
        &self.placed
    }

    /// The fields as a map whose values share the head's bytes.
    pub(crate) fn to_map(&self) -> Result<HeaderMap, BridgeError> {
        self.placed.to_map()
    }

    /// The first value of the field `known`, where the parse noted it.
    fn known(&self, known: Known) -> Option<&[u8]> {
        self.placed.value(self.known.index(known)?)
    }
}

/// A field the stages on every request's path read.
#[derive(Clone, Copy)]
pub(crate) enum Known {
    Host,
    ContentLength,
    RequestId,
    ForwardedFor,
    Upgrade,
    TransferEncoding,
}

impl Known {
    fn name(self) -> &'static HeaderName {
        static X_REQUEST_ID: HeaderName = forwarded::X_REQUEST_ID;
        static X_FORWARDED_FOR: HeaderName = forwarded::X_FORWARDED_FOR;
        match self {
            Known::Host => &http::header::HOST,
            Known::ContentLength => &http::header::CONTENT_LENGTH,
            Known::RequestId => &X_REQUEST_ID,
            Known::ForwardedFor => &X_FORWARDED_FOR,
            Known::Upgrade => &http::header::UPGRADE,
            Known::TransferEncoding => &http::header::TRANSFER_ENCODING,
        }
    }

    /// The known field named `name` (any case). Its length first: most fields are no
    /// known one, and are passed over on it.
    fn of(name: &[u8]) -> Option<Known> {
        let (known, spelled): (Known, &[u8]) = match name.len() {
            4 => (Known::Host, b"host"),
            7 => (Known::Upgrade, b"upgrade"),
            12 => (Known::RequestId, b"x-request-id"),
            14 => (Known::ContentLength, b"content-length"),
            15 => (Known::ForwardedFor, b"x-forwarded-for"),
            17 => (Known::TransferEncoding, b"transfer-encoding"),
            _ => return None,
        };
        name.eq_ignore_ascii_case(spelled).then_some(known)
    }
}

/// Where the fields the stages on every request's path read sit among a request's
/// fields, noted in the parse's one walk over them (as nginx's `headers_in` keeps a pointer
/// to each field it knows): each lookup was otherwise a walk of its own, nine a request
/// (callgrind: 840 instructions a request).
#[derive(Clone, Copy, Default)]
pub(crate) struct KnownFields {
    /// The index of the first field of each `Known`, plus one (0: none).
    first: [u16; 6],
    hosts: u16,
    /// The bytes of the names and values, each with its `: ` and line end.
    bytes: usize,
}

impl KnownFields {
    /// Notes the field at `index` named `name` (any case) whose value is `value_len` long.
    #[inline]
    pub(crate) fn note(&mut self, index: usize, name: &[u8], value_len: usize) {
        self.bytes += name.len() + value_len + 4;
        let Some(known) = Known::of(name) else {
            return;
        };
        if matches!(known, Known::Host) {
            self.hosts = self.hosts.saturating_add(1);
        }
        let first = &mut self.first[known as usize];
        if *first == 0 {
            // A first one past the 65,534th field would read as absent; the codec takes
            // 100 fields at most.
            *first = u16::try_from(index + 1).unwrap_or(0);
        }
    }

    /// Whether the request has fields that change how it is framed or tunnelled.
    pub(crate) fn reframes(&self) -> bool {
        self.first[Known::Upgrade as usize] != 0
            || self.first[Known::TransferEncoding as usize] != 0
    }

    /// The index of the first field `known`, when it was noted.
    fn index(&self, known: Known) -> Option<usize> {
        self.first[known as usize].checked_sub(1).map(usize::from)
    }
}

/// Fields as a client would send them, for tests: a head holding `pairs`, in order.
#[cfg(test)]
pub(crate) fn from_pairs(pairs: &[(&str, &str)]) -> RequestFields {
    let mut head = b"GET / HTTP/1.1\r\n".to_vec();
    let mut places = Vec::new();
    for (name, value) in pairs {
        let name_start = head.len() as u32;
        head.extend_from_slice(name.as_bytes());
        let name_end = head.len() as u32;
        head.extend_from_slice(b": ");
        let value_start = head.len() as u32;
        head.extend_from_slice(value.as_bytes());
        places.push((name_start, name_end, value_start, head.len() as u32));
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    RequestFields::new(bytes::Bytes::from(head), &places)
}

/// A request's fields, however they are held.
#[derive(Clone, Copy)]
pub(crate) enum Fields<'a> {
    AsRead(&'a RequestFields),
    Map(&'a HeaderMap),
}

impl<'a> Fields<'a> {
    /// The fields of a request: `as_read` when it has them, its map otherwise.
    pub(crate) fn of(map: &'a HeaderMap, as_read: Option<&'a RequestFields>) -> Self {
        as_read.map_or(Fields::Map(map), Fields::AsRead)
    }

    /// The first value of the field `known`.
    pub(crate) fn get(self, known: Known) -> Option<&'a [u8]> {
        match self {
            Fields::AsRead(fields) => fields.known(known),
            Fields::Map(map) => map.get(known.name()).map(http::HeaderValue::as_bytes),
        }
    }

    /// The first value of the field `name` (lower case): for a stage that reads one field
    /// beyond the known ones, without `values`' chain of iterators.
    pub(crate) fn first(self, name: &str) -> Option<&'a [u8]> {
        match self {
            Fields::AsRead(fields) => fields.placed.get(name.as_bytes()),
            Fields::Map(map) => map.get(name).map(http::HeaderValue::as_bytes),
        }
    }

    /// Every value of the field `name` (lower case), in the order sent: for the stages
    /// that read one field beyond the known ones without making the request a map.
    pub(crate) fn values<'n>(self, name: &'n str) -> impl Iterator<Item = &'a [u8]> + 'n
    where
        'a: 'n,
    {
        let (as_read, map) = match self {
            Fields::AsRead(fields) => (Some(fields), None),
            Fields::Map(map) => (None, Some(map.get_all(name))),
        };
        let read = as_read.into_iter().flat_map(move |fields| {
            fields
                .iter()
                .filter(move |(field, _)| field.eq_ignore_ascii_case(name.as_bytes()))
                .map(|(_, value)| value)
        });
        let mapped = map
            .into_iter()
            .flat_map(|values| values.into_iter().map(http::HeaderValue::as_bytes));
        read.chain(mapped)
    }

    /// Whether the request has a field `known`.
    pub(crate) fn contains(self, known: Known) -> bool {
        self.get(known).is_some()
    }

    /// How many Host fields the request has.
    pub(crate) fn hosts(self) -> usize {
        match self {
            Fields::AsRead(fields) => usize::from(fields.known.hosts),
            Fields::Map(map) => map.get_all(http::header::HOST).iter().count(),
        }
    }

    /// The bytes of the fields' names and values, each with its `: ` and line end.
    pub(crate) fn head_bytes(self) -> usize {
        match self {
            Fields::AsRead(fields) => fields.known.bytes,
            Fields::Map(map) => map
                .iter()
                .map(|(name, value)| name.as_str().len() + value.len() + 4)
                .sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn fields_read_the_same_as_read_and_as_a_map() {
        let head = Bytes::from_static(
            b"GET / HTTP/1.1\r\nHost: a.test\r\nX-Forwarded-For: 1\r\nx-forwarded-for: 2\r\nHOST: b\r\n\r\n",
        );
        let places = [
            (16, 20, 22, 28),
            (30, 45, 47, 48),
            (50, 65, 67, 68),
            (70, 74, 76, 77),
        ];
        let as_read = RequestFields::new(head.clone(), &places);
        let map = RequestFields::new(head, &places)
            .to_map()
            .expect("valid fields");
        for fields in [Fields::AsRead(&as_read), Fields::Map(&map)] {
            assert_eq!(fields.get(Known::Host), Some(&b"a.test"[..]));
            assert_eq!(fields.get(Known::ForwardedFor), Some(&b"1"[..]));
            assert_eq!(fields.hosts(), 2);
            assert!(!fields.contains(Known::ContentLength));
            assert!(!fields.contains(Known::Upgrade));
            let forwarded: Vec<&[u8]> = fields.values("x-forwarded-for").collect();
            assert_eq!(forwarded, [&b"1"[..], &b"2"[..]]);
            assert_eq!(fields.values("accept").count(), 0);
            assert_eq!(
                fields.head_bytes(),
                (4 + 6 + 4) + 2 * (15 + 1 + 4) + (4 + 1 + 4)
            );
        }
    }

    #[test]
    fn the_fields_noted_while_parsing_are_the_fields_looked_for() {
        let pairs = [
            ("content-LENGTH", "5"),
            ("Upgrade", "websocket"),
            ("X-Request-Id", "a"),
            ("Transfer-Encoding", "chunked"),
            ("Hos", "x"),
            ("Hostx", "y"),
        ];
        let fields = from_pairs(&pairs);
        assert!(fields.known.reframes());
        let fields = Fields::AsRead(&fields);
        assert_eq!(fields.get(Known::ContentLength), Some(&b"5"[..]));
        assert_eq!(fields.get(Known::Upgrade), Some(&b"websocket"[..]));
        assert_eq!(fields.get(Known::RequestId), Some(&b"a"[..]));
        assert_eq!(fields.get(Known::TransferEncoding), Some(&b"chunked"[..]));
        assert_eq!(fields.get(Known::Host), None);
        assert_eq!(fields.hosts(), 0);
        assert!(!from_pairs(&[("Host", "a")]).known.reframes());
    }

    #[test]
    fn a_place_outside_the_head_is_skipped() {
        let head = Bytes::from_static(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        let fields = RequestFields::new(head, &[(16, 20, 22, 23), (40, 44, 46, 90)]);
        assert_eq!(fields.iter().count(), 1);
    }
}
