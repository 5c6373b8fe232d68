//! A message's fields as a stage edits them: a map, and for an answer going to an HTTP/1.x
//! client the app's fields still as read beside it (`switchyard_h1::AnswerFields`). Edits
//! of fields as read are made where they sit: a field removed is passed over, a field set
//! or appended goes in the map, which the client's writer puts after the fields as read
//! and in place of any of the same name. So an app whose stages edit its answers
//! (compression, header rules) does not pay for a map of every field of every answer
//! (callgrind: ~4k instructions an answer, a sixth of a plain request).
//!
//! One rule keeps the two halves one set of fields: a name is in the map or among the
//! fields as read, never both.

use http::{HeaderMap, HeaderName, HeaderValue};
use smallvec::SmallVec;
use switchyard_h1::AnswerFields;
use switchyard_model::HeaderEdits;

pub(crate) struct FieldsMut<'a> {
    map: &'a mut HeaderMap,
    as_read: Option<&'a mut AnswerFields>,
}

impl<'a> FieldsMut<'a> {
    /// The fields in `map` and, when the answer's go on as read, `as_read`.
    pub(crate) fn new(map: &'a mut HeaderMap, as_read: Option<&'a mut AnswerFields>) -> Self {
        Self { map, as_read }
    }

    /// Fields that are all in `map`.
    pub(crate) fn map(map: &'a mut HeaderMap) -> Self {
        Self { map, as_read: None }
    }

    /// The first value of the field `name`.
    pub(crate) fn get(&self, name: &HeaderName) -> Option<&[u8]> {
        match self.map.get(name) {
            Some(value) => Some(value.as_bytes()),
            None => self.as_read.as_deref()?.get(name.as_str()),
        }
    }

    /// Each field, name and value: the map's, then those as read. For a stage that looks
    /// for several fields: one walk rather than one per field.
    pub(crate) fn each<'s>(&'s self, mut each: impl FnMut(&'s [u8], &'s [u8])) {
        for (name, value) in self.map.iter() {
            each(name.as_ref(), value.as_bytes());
        }
        if let Some(as_read) = self.as_read.as_deref() {
            as_read.iter().for_each(|(name, value)| each(name, value));
        }
    }

    /// `name` has `value` alone.
    pub(crate) fn insert(&mut self, name: HeaderName, value: HeaderValue) {
        if let Some(as_read) = self.as_read.as_deref_mut() {
            as_read.remove(name.as_str().as_bytes());
        }
        self.map.insert(name, value);
    }

    /// No field `name` is left.
    pub(crate) fn remove(&mut self, name: &HeaderName) {
        if let Some(as_read) = self.as_read.as_deref_mut() {
            as_read.remove(name.as_str().as_bytes());
        }
        self.map.remove(name);
    }

    /// `value` after the field's others.
    pub(crate) fn append(&mut self, name: HeaderName, value: HeaderValue) {
        if let Some(as_read) = self.as_read.as_deref_mut() {
            // The app's values of that name join the map first, in their order.
            let mut values: SmallVec<[HeaderValue; 2]> = SmallVec::new();
            as_read.each_value(name.as_str().as_bytes(), |value| {
                // Checked as field values when the head was parsed.
                if let Ok(value) = HeaderValue::from_bytes(value) {
                    values.push(value);
                }
                true
            });
            if !values.is_empty() {
                as_read.remove(name.as_str().as_bytes());
                for value in values {
                    self.map.append(name.clone(), value);
                }
            }
        }
        self.map.append(name, value);
    }
}

/// Edits of a message's fields, names and values made once (an app's header rules of one
/// direction, made when its route is built): remove, then set, then append.
#[derive(Debug, Default)]
pub(crate) struct FieldEdits {
    remove: Box<[HeaderName]>,
    set: Box<[(HeaderName, HeaderValue)]>,
    append: Box<[(HeaderName, HeaderValue)]>,
}

impl FieldEdits {
    /// Names and values were checked when the app was stored; one that `http` still
    /// refuses is left out rather than failing the app's route.
    pub(crate) fn of(edits: &HeaderEdits) -> Self {
        let field = |(name, value): (&String, &String)| {
            Some((
                HeaderName::try_from(name.as_str()).ok()?,
                HeaderValue::try_from(value.as_str()).ok()?,
            ))
        };
        Self {
            remove: (edits.remove.iter())
                .filter_map(|name| HeaderName::try_from(name.as_str()).ok())
                .collect(),
            set: edits.set.iter().filter_map(field).collect(),
            append: edits.append.iter().filter_map(field).collect(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.set.is_empty() && self.append.is_empty()
    }

    /// The edits made on `fields`.
    pub(crate) fn apply(&self, fields: &mut FieldsMut<'_>) {
        for name in &self.remove {
            fields.remove(name);
        }
        for (name, value) in &self.set {
            fields.insert(name.clone(), value.clone());
        }
        for (name, value) in &self.append {
            fields.append(name.clone(), value.clone());
        }
    }

    /// Whether a field of this name (as sent, any case) is left out of a request whose
    /// fields go on as read: removed, or set in place of the client's.
    pub(crate) fn left_out(&self, name: &[u8]) -> bool {
        self.remove
            .iter()
            .chain(self.set.iter().map(|(name, _)| name))
            .any(|edited| name.eq_ignore_ascii_case(edited.as_ref()))
    }

    /// The fields set, written in place of the client's.
    pub(crate) fn set(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        (self.set.iter()).map(|(name, value)| (name.as_ref(), value.as_bytes()))
    }

    /// The fields appended, written beside the client's.
    pub(crate) fn appended(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        (self.append.iter()).map(|(name, value)| (name.as_ref(), value.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn answer(head: &'static [u8]) -> AnswerFields {
        let mut slots = switchyard_h1::header_slots();
        let parsed = switchyard_h1::parse_response(head, &mut slots, false)
            .expect("valid")
            .expect("whole");
        let mut places = Vec::new();
        let facts = switchyard_h1::place_fields(&parsed, head, false, &mut places);
        AnswerFields::placed(Bytes::from_static(head), &places, facts)
    }

    /// The fields a client gets: those as read, less the map's names, then the map's.
    fn written(map: &HeaderMap, as_read: &AnswerFields) -> Vec<(String, String)> {
        let text = |b: &[u8]| String::from_utf8_lossy(b).to_ascii_lowercase();
        as_read
            .iter()
            .filter(|(name, _)| !map.keys().any(|k| name.eq_ignore_ascii_case(k.as_ref())))
            .map(|(n, v)| (text(n), text(v)))
            .chain(
                map.iter()
                    .map(|(n, v)| (text(n.as_ref()), text(v.as_bytes()))),
            )
            .collect()
    }

    #[test]
    fn edits_of_fields_as_read_give_what_the_same_edits_of_a_map_give() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 5000\r\n\
            Vary: Cookie\r\nServer: app\r\nETag: \"v1\"\r\n\r\n";
        let edit = |fields: &mut FieldsMut<'_>| {
            assert_eq!(
                fields.get(&http::header::CONTENT_TYPE),
                Some(&b"text/html"[..])
            );
            let mut varies = Vec::new();
            fields.each(|name, value| {
                if name.eq_ignore_ascii_case(b"vary") {
                    varies.push(value.to_vec());
                }
            });
            assert_eq!(varies, [b"Cookie".to_vec()]);
            fields.remove(&http::header::CONTENT_LENGTH);
            fields.remove(&http::header::SERVER);
            fields.insert(http::header::ETAG, HeaderValue::from_static("W/\"v1\""));
            fields.append(
                http::header::VARY,
                HeaderValue::from_static("Accept-Encoding"),
            );
            fields.insert(
                http::header::CONTENT_ENCODING,
                HeaderValue::from_static("gzip"),
            );
        };
        let mut as_read = answer(head);
        let mut own = HeaderMap::new();
        edit(&mut FieldsMut::new(&mut own, Some(&mut as_read)));
        assert_eq!(
            as_read.content_length(),
            None,
            "the length's fact went with it"
        );
        let mut map = switchyard_h1::fields_map(&Bytes::from_static(head), &{
            let mut slots = switchyard_h1::header_slots();
            let parsed = switchyard_h1::parse_response(head, &mut slots, false)
                .expect("valid")
                .expect("whole");
            let mut places = Vec::new();
            switchyard_h1::place_fields(&parsed, head, false, &mut places);
            places
        })
        .expect("valid");
        edit(&mut FieldsMut::map(&mut map));
        let mut got = written(&own, &as_read);
        let mut want: Vec<_> = written(&map, &answer(b"HTTP/1.1 200 OK\r\n\r\n"));
        got.sort();
        want.sort();
        assert_eq!(got, want);
        let vary: Vec<_> = own.get_all("vary").iter().collect();
        assert_eq!(vary, ["Cookie", "Accept-Encoding"], "in their order");
    }
}
