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

use http::{HeaderMap, HeaderName};

/// An HTTP/1.x client's fields where it sent them, in its order and spelling.
pub(crate) use switchyard_h1::PlacedFields as RequestFields;

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

    /// The first value of the field `name`.
    pub(crate) fn get(self, name: &HeaderName) -> Option<&'a [u8]> {
        match self {
            Fields::AsRead(fields) => fields.get(name.as_str().as_bytes()),
            Fields::Map(map) => map.get(name).map(http::HeaderValue::as_bytes),
        }
    }

    /// Whether the request has a field `name`.
    pub(crate) fn contains(self, name: &HeaderName) -> bool {
        self.get(name).is_some()
    }

    /// How many fields named `name` the request has.
    pub(crate) fn count(self, name: &HeaderName) -> usize {
        match self {
            Fields::AsRead(fields) => {
                let mut count = 0;
                fields.each_value(name.as_str().as_bytes(), |_| {
                    count += 1;
                    true
                });
                count
            }
            Fields::Map(map) => map.get_all(name).iter().count(),
        }
    }

    /// The bytes of the fields' names and values, each with its `: ` and line end.
    pub(crate) fn head_bytes(self) -> usize {
        match self {
            Fields::AsRead(fields) => fields
                .iter()
                .map(|(name, value)| name.len() + value.len() + 4)
                .sum(),
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
    use http::header::{HOST, USER_AGENT};

    #[test]
    fn fields_read_the_same_as_read_and_as_a_map() {
        let head =
            Bytes::from_static(b"GET / HTTP/1.1\r\nHost: a.test\r\nX-Two: 1\r\nx-two: 2\r\n\r\n");
        let as_read = RequestFields::new(
            head.clone(),
            &[(16, 20, 22, 28), (30, 35, 37, 38), (40, 45, 47, 48)],
        );
        let map = RequestFields::new(
            head,
            &[(16, 20, 22, 28), (30, 35, 37, 38), (40, 45, 47, 48)],
        )
        .to_map()
        .expect("valid fields");
        let two = HeaderName::from_static("x-two");
        for fields in [Fields::AsRead(&as_read), Fields::Map(&map)] {
            assert_eq!(fields.get(&HOST), Some(&b"a.test"[..]));
            assert_eq!(fields.get(&two), Some(&b"1"[..]));
            assert_eq!(fields.count(&two), 2);
            assert!(!fields.contains(&USER_AGENT));
            assert_eq!(fields.head_bytes(), 4 + 6 + 4 + 2 * (5 + 1 + 4));
        }
    }

    #[test]
    fn a_place_outside_the_head_is_skipped() {
        let head = Bytes::from_static(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        let fields = RequestFields::new(head, &[(16, 20, 22, 23), (40, 44, 46, 90)]);
        assert_eq!(fields.iter().count(), 1);
    }
}
