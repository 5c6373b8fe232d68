//! An answer's fields as the backend sent them, for a client on HTTP/1.x: the head's bytes
//! and where each field the client gets sits in them. No `HeaderMap` is built for an answer
//! no stage reads: its fields go from the backend's read buffer to the client's head as
//! nginx's `proxy_pass` writes them, in the backend's order and spelling.

use bytes::Bytes;

/// Where a field sits in a head: name start and end, value start and end.
pub type FieldPlace = (u32, u32, u32, u32);

/// The fields of an answer's head that go on to the client, as read. Boxed: it rides in
/// the answer's body, which is moved several times on its way to the client, and a pointer
/// moves for less than the copies cost (callgrind).
pub struct AnswerFields(Box<Fields>);

struct Fields {
    head: Bytes,
    places: Box<[FieldPlace]>,
    /// What the writer of the client's head asks of every answer, read in the one walk
    /// that builds this rather than looked up field by field.
    length: Option<u64>,
    codings: bool,
}

impl AnswerFields {
    /// The fields at `places` in `head` (the head's bytes, split off the read buffer, so
    /// that the fields share it). `places` come from the parse of this head; one outside
    /// it is skipped, never read.
    pub fn new(head: Bytes, places: &[FieldPlace]) -> Self {
        let mut fields = Self(Box::new(Fields {
            head,
            places: places.into(),
            length: None,
            codings: false,
        }));
        let (mut length, mut codings) = (None, false);
        for (name, value) in fields.iter() {
            if length.is_none() && name.eq_ignore_ascii_case(b"content-length") {
                length = crate::fields::parse_decimal(value);
            }
            codings |= name.eq_ignore_ascii_case(b"transfer-encoding");
        }
        fields.0.length = length;
        fields.0.codings = codings;
        fields
    }

    /// The answer's Content-Length, when it has one.
    pub fn content_length(&self) -> Option<u64> {
        self.0.length
    }

    /// Whether the answer has Transfer-Encoding lines (codings the client is to undo).
    pub fn has_codings(&self) -> bool {
        self.0.codings
    }

    /// The fields, names and values, in the order the backend sent them.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + Clone {
        let Fields { head, places, .. } = &*self.0;
        places
            .iter()
            .filter_map(|&(name_start, name_end, start, end)| {
                let name = head.get(name_start as usize..name_end as usize)?;
                let value = head.get(start as usize..end as usize)?;
                Some((name, value))
            })
    }

    /// The first value of the field named `name` (any case).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(field, _)| field.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, value)| value)
    }

    /// How many fields there are.
    pub fn len(&self) -> usize {
        self.0.places.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.places.is_empty()
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
        assert_eq!(fields.len(), 3);
        assert_eq!(fields.content_length(), None);
        assert!(!fields.has_codings());
        let head = Bytes::from_static(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n");
        let fields = AnswerFields::new(head, &[(17, 31, 33, 35)]);
        assert_eq!(fields.content_length(), Some(12));
    }
}
