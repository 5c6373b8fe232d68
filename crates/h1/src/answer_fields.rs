//! An answer's fields as the backend sent them, for a client on HTTP/1.x: the head's bytes
//! and where each field the client gets sits in them. No `HeaderMap` is built for an answer
//! no stage reads: its fields go from the backend's read buffer to the client's head as
//! nginx's `proxy_pass` writes them, in the backend's order and spelling.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;

use crate::bridge::{coding_fields, end_to_end_fields, BridgeError};
use crate::response::ResponseHead;

/// Where a field sits in a head: name start and end, value start and end.
pub type FieldPlace = (u32, u32, u32, u32);

/// What the writer of the client's head asks of every answer, noted while its fields are
/// placed rather than looked up again field by field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AnswerFacts {
    /// The Content-Length placed, when one is.
    pub length: Option<u64>,
    /// Whether Transfer-Encoding lines are placed (codings the client is to undo).
    pub codings: bool,
}

impl AnswerFacts {
    fn note(&mut self, name: &[u8], value: &[u8]) {
        match name.len() {
            14 if self.length.is_none() && name.eq_ignore_ascii_case(b"content-length") => {
                self.length = crate::fields::content_length_value(value);
            }
            17 => self.codings |= name.eq_ignore_ascii_case(b"transfer-encoding"),
            _ => {}
        }
    }
}

/// Puts in `places` (cleared first) where the fields of `head` that go on to the client
/// sit in `buffer`, the bytes `head` was parsed from: the end-to-end fields and the codings
/// the client is to undo, or, for a protocol switch (`every`), all of them (the client's
/// side of an upgrade needs the Upgrade and Connection that are hop-by-hop elsewhere).
/// Returns what the fields placed say of the answer's length and codings.
pub fn place_fields(
    head: &ResponseHead<'_, '_>,
    buffer: &[u8],
    every: bool,
    places: &mut Vec<FieldPlace>,
) -> AnswerFacts {
    let base = buffer.as_ptr() as usize;
    let offset = |piece: &[u8]| (piece.as_ptr() as usize).wrapping_sub(base) as u32;
    places.clear();
    let mut facts = AnswerFacts::default();
    let mut place = |field: &crate::Header<'_>| {
        facts.note(field.name.as_bytes(), field.value);
        let (name, value) = (offset(field.name.as_bytes()), offset(field.value));
        let name_end = name.wrapping_add(field.name.len() as u32);
        places.push((
            name,
            name_end,
            value,
            value.wrapping_add(field.value.len() as u32),
        ));
    };
    if every {
        head.headers.iter().for_each(&mut place);
    } else {
        end_to_end_fields(head).for_each(&mut place);
        coding_fields(head).for_each(&mut place);
    }
    facts
}

/// The fields at `places` in `head` as a map whose values share `head`'s bytes: for the
/// answers a stage reads and HTTP/2 clients' (whose server takes a map). A field `http`
/// refuses, or a place outside the head, is an error.
pub fn fields_map(head: &Bytes, places: &[FieldPlace]) -> Result<HeaderMap, BridgeError> {
    let mut headers = HeaderMap::with_capacity(places.len());
    for &(name_start, name_end, value_start, value_end) in places {
        if name_start == LEFT_OUT {
            continue;
        }
        let name = head
            .get(name_start as usize..name_end as usize)
            .ok_or(BridgeError::Invalid)?;
        let name = HeaderName::from_bytes(name).map_err(|_| BridgeError::Invalid)?;
        let values = value_start as usize..value_end as usize;
        if head.get(values.clone()).is_none() {
            return Err(BridgeError::Invalid);
        }
        let value =
            HeaderValue::from_maybe_shared(head.slice(values)).map_err(|_| BridgeError::Invalid)?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// The place of a field taken out ([`PlacedFields::remove`]): outside every head, so every
/// reader passes over it.
const LEFT_OUT: u32 = u32::MAX;

/// One field as [`PlacedFields::lines`] gives it.
pub(crate) struct Line<'f> {
    pub(crate) name: &'f [u8],
    pub(crate) value: &'f [u8],
    /// Where its whole line (name to CRLF) sits in the head, when it ends right after the
    /// value.
    pub(crate) span: Option<(usize, usize)>,
}

/// A message's fields where they were read: the head's bytes (split off the read buffer,
/// so that the fields share it) and where each field sits in them. What an answer's
/// ([`AnswerFields`]) and an HTTP/1.x client's request's fields as read are made of.
pub struct PlacedFields {
    head: Bytes,
    places: Box<[FieldPlace]>,
}

impl PlacedFields {
    /// The fields at `places` in `head`. `places` come from the parse of this head; one
    /// outside it is skipped, never read.
    pub fn new(head: Bytes, places: &[FieldPlace]) -> Self {
        Self {
            head,
            places: places.into(),
        }
    }

    /// Each field's name, value and the whole line it was read in (up to and with its
    /// CRLF) when the line ends right after the value, in the order they were sent: a
    /// writer copies consecutive whole lines at once.
    pub(crate) fn lines(&self) -> impl Iterator<Item = Line<'_>> {
        self.places
            .iter()
            .filter_map(|&(name_start, name_end, start, end)| {
                let name = self.head.get(name_start as usize..name_end as usize)?;
                let value = self.head.get(start as usize..end as usize)?;
                let line_end = end as usize + 2;
                let whole = self.head.get(end as usize..line_end) == Some(b"\r\n");
                Some(Line {
                    name,
                    value,
                    span: whole.then_some((name_start as usize, line_end)),
                })
            })
    }

    /// The bytes the fields were read from.
    pub(crate) fn head(&self) -> &[u8] {
        &self.head
    }

    /// The fields, names and values, in the order they were sent.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + Clone {
        self.places
            .iter()
            .filter_map(|&(name_start, name_end, start, end)| {
                let name = self.head.get(name_start as usize..name_end as usize)?;
                let value = self.head.get(start as usize..end as usize)?;
                Some((name, value))
            })
    }

    /// The value of each field named `name` (any case), in order, until `each` says stop.
    /// A name's length is compared before its bytes are looked at: most fields are passed
    /// over on it.
    pub fn each_value<'f>(&'f self, name: &[u8], mut each: impl FnMut(&'f [u8]) -> bool) {
        for &place @ (_, _, start, end) in self.places.iter() {
            if !self.is_named(place, name) {
                continue;
            }
            if let Some(value) = self.head.get(start as usize..end as usize) {
                if !each(value) {
                    return;
                }
            }
        }
    }

    /// The value of the field at `index` in the order they were sent, for a reader that
    /// noted where a field sits while the head was parsed.
    pub fn value(&self, index: usize) -> Option<&[u8]> {
        let &(_, _, start, end) = self.places.get(index)?;
        self.head.get(start as usize..end as usize)
    }

    /// The first value of the field named `name` (any case).
    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        let mut first = None;
        self.each_value(name, |value| {
            first = Some(value);
            false
        });
        first
    }

    /// Takes out every field named `name` (any case): a stage's edit of fields that go on
    /// as read. Returns whether there was one.
    pub fn remove(&mut self, name: &[u8]) -> bool {
        let mut removed = false;
        for index in 0..self.places.len() {
            if self.is_named(self.places[index], name) {
                self.places[index] = (LEFT_OUT, LEFT_OUT, LEFT_OUT, LEFT_OUT);
                removed = true;
            }
        }
        removed
    }

    /// Whether the field at `place` is named `name` (any case). Its length first: most
    /// fields are passed over on it.
    fn is_named(&self, (name_start, name_end, _, _): FieldPlace, name: &[u8]) -> bool {
        name_end.wrapping_sub(name_start) as usize == name.len()
            && (self.head.get(name_start as usize..name_end as usize))
                .is_some_and(|field| field.eq_ignore_ascii_case(name))
    }

    /// The fields as a map whose values share the head's bytes ([`fields_map`]).
    pub fn to_map(&self) -> Result<HeaderMap, BridgeError> {
        fields_map(&self.head, &self.places)
    }
}

/// The fields of an answer's head that go on to the client, as read. Boxed: it rides in
/// the answer's body, which is moved several times on its way to the client, and a pointer
/// moves for less than the copies cost (callgrind).
pub struct AnswerFields(Box<Fields>);

struct Fields {
    placed: PlacedFields,
    facts: AnswerFacts,
}

impl AnswerFields {
    /// The fields at `places` in `head` (see [`PlacedFields::new`]), their facts read in
    /// one walk.
    pub fn new(head: Bytes, places: &[FieldPlace]) -> Self {
        let placed = PlacedFields::new(head, places);
        let mut facts = AnswerFacts::default();
        for (name, value) in placed.iter() {
            facts.note(name, value);
        }
        Self(Box::new(Fields { placed, facts }))
    }

    /// The fields at `places` in `head`, with the `facts` [`place_fields`] noted as it
    /// placed them.
    pub fn placed(head: Bytes, places: &[FieldPlace], facts: AnswerFacts) -> Self {
        Self(Box::new(Fields {
            placed: PlacedFields::new(head, places),
            facts,
        }))
    }

    /// The answer's Content-Length, when it has one.
    pub fn content_length(&self) -> Option<u64> {
        self.0.facts.length
    }

    /// Whether the answer has Transfer-Encoding lines (codings the client is to undo).
    pub fn has_codings(&self) -> bool {
        self.0.facts.codings
    }

    /// The fields, names and values, in the order the backend sent them.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + Clone {
        self.0.placed.iter()
    }

    /// The first value of the field named `name` (any case).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.0.placed.get(name.as_bytes())
    }

    /// The value of each field named `name` (any case), in order, until `each` says stop.
    pub fn each_value<'f>(&'f self, name: &[u8], each: impl FnMut(&'f [u8]) -> bool) {
        self.0.placed.each_value(name, each);
    }

    /// Takes out every field named `name` (any case), and what it said of the answer's
    /// length or codings. Returns whether there was one.
    pub fn remove(&mut self, name: &[u8]) -> bool {
        let fields = &mut *self.0;
        if !fields.placed.remove(name) {
            return false;
        }
        if name.eq_ignore_ascii_case(b"content-length") {
            fields.facts.length = None;
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            fields.facts.codings = false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_where_they_sit_and_a_place_outside_the_head_is_skipped() {
        let head = Bytes::from_static(b"HTTP/1.1 200 OK\r\nX-A: 1\r\nSet-Cookie: a\r\n\r\n");
        let fields = AnswerFields::new(
            head,
            &[(17, 20, 22, 23), (25, 35, 37, 38), (60, 70, 71, 90)],
        );
        let read: Vec<_> = fields.iter().collect();
        assert_eq!(
            read,
            [(&b"X-A"[..], &b"1"[..]), (&b"Set-Cookie"[..], &b"a"[..])]
        );
        assert_eq!(fields.get("set-cookie"), Some(&b"a"[..]));
        assert_eq!(fields.get("x-b"), None);
        assert_eq!(fields.content_length(), None);
        assert!(!fields.has_codings());
        let head = Bytes::from_static(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n");
        let fields = AnswerFields::new(head, &[(17, 31, 33, 35)]);
        assert_eq!(fields.content_length(), Some(12));
    }

    #[test]
    fn a_field_taken_out_is_passed_over_by_every_reader_and_its_fact_forgotten() {
        let head = Bytes::from_static(
            b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nVary: Cookie\r\nvary: Origin\r\n\r\n",
        );
        let mut fields = AnswerFields::new(
            head.clone(),
            &[(17, 31, 33, 35), (37, 41, 43, 49), (51, 55, 57, 63)],
        );
        assert!(fields.remove(b"VARY"));
        assert!(!fields.remove(b"vary"), "nothing left of that name");
        let read: Vec<_> = fields.iter().collect();
        assert_eq!(read, [(&b"Content-Length"[..], &b"12"[..])]);
        assert_eq!(fields.content_length(), Some(12));
        assert!(fields.remove(b"content-length"));
        assert_eq!(fields.content_length(), None);
        assert_eq!(fields.iter().count(), 0);
        let mut placed = PlacedFields::new(head, &[(37, 41, 43, 49), (51, 55, 57, 63)]);
        placed.remove(b"vary");
        assert!(placed.to_map().expect("valid").is_empty());
        assert_eq!(placed.lines().count(), 0);
    }

    #[test]
    fn the_fields_placed_are_the_ones_the_client_gets_and_their_map_shares_the_head() {
        let head = b"HTTP/1.1 200 OK\r\nConnection: x-hop\r\nX-Hop: 1\r\nContent-Length: 2\r\n\
            Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\nX-App: a\r\n\r\n";
        let mut slots = crate::header_slots();
        let parsed = crate::parse_response(head, &mut slots, false)
            .expect("valid")
            .expect("whole");
        let mut places = Vec::new();
        let facts = place_fields(&parsed, head, false, &mut places);
        let bytes = Bytes::copy_from_slice(head);
        let map = fields_map(&bytes, &places).expect("valid fields");
        let names: Vec<_> = map
            .iter()
            .map(|(name, v)| (name.as_str(), v.as_bytes()))
            .collect();
        // Connection and what it names go; the length goes with chunked; the app's coding
        // stays for the client to undo.
        assert_eq!(
            names,
            [
                ("x-app", &b"a"[..]),
                ("transfer-encoding", b"gzip"),
                ("transfer-encoding", b"chunked")
            ]
        );
        let as_read = AnswerFields::new(bytes, &places);
        assert!(as_read.has_codings());
        assert_eq!(
            facts,
            AnswerFacts {
                length: None,
                codings: true
            },
            "the facts noted while placing are those the walk reads"
        );
        place_fields(&parsed, head, true, &mut places);
        assert_eq!(places.len(), 6, "a protocol switch keeps every field");
        assert!(fields_map(&Bytes::from_static(b"short"), &places).is_err());
    }
}
