//! Validators: a client's conditional request answered from a stored copy (RFC 9110 §13.1,
//! RFC 9111 §4.3.2), the conditional request that asks the app whether a stale copy still
//! holds (§4.3.1), and a 304's fields merged into the copy it validated (§3.2, §4.3.4).

use http::{header, HeaderMap, HeaderName};

use super::freshness::date_field;

/// The fields a 304 carries to a client (RFC 9110 §15.4.5): those a 200 would have had that
/// guide its cache, and `Last-Modified` for clients that validate with dates.
pub(crate) const NOT_MODIFIED_FIELDS: [HeaderName; 7] = [
    header::CACHE_CONTROL,
    header::CONTENT_LOCATION,
    header::DATE,
    header::ETAG,
    header::EXPIRES,
    header::VARY,
    header::LAST_MODIFIED,
];

/// Whether the client's conditional GET or HEAD is answered 304 by the stored fields:
/// `If-None-Match` by weak comparison when the client sent it, else `If-Modified-Since`
/// against `Last-Modified` (§13.2.2's order).
pub(crate) fn not_modified(request: &HeaderMap, stored: &HeaderMap) -> bool {
    if request.contains_key(header::IF_NONE_MATCH) {
        let stored_tag = stored.get(header::ETAG).map(|t| opaque(t.as_bytes()));
        return request
            .get_all(header::IF_NONE_MATCH)
            .iter()
            .flat_map(|value| entity_tags(value.as_bytes()))
            .any(|tag| tag == b"*" || Some(opaque(tag)) == stored_tag);
    }
    let (Some(since), Some(modified)) = (
        date_field(request, header::IF_MODIFIED_SINCE),
        date_field(stored, header::LAST_MODIFIED),
    ) else {
        return false;
    };
    modified <= since
}

/// Takes the client's conditionals out of a request that fills the cache: the app is to
/// answer whole (a 304 meant for the client's own copy could not be kept), and the cache
/// answers them itself.
pub(crate) fn take_conditionals(request: &mut HeaderMap) -> HeaderMap {
    let mut taken = HeaderMap::new();
    for name in [header::IF_NONE_MATCH, header::IF_MODIFIED_SINCE] {
        if let http::header::Entry::Occupied(field) = request.entry(name) {
            let (name, values) = field.remove_entry_mult();
            for value in values {
                taken.append(name.clone(), value);
            }
        }
    }
    taken
}

/// Makes the request the app gets ask whether the stale `stored` copy still holds.
pub(crate) fn ask_if_changed(request: &mut HeaderMap, stored: &HeaderMap) {
    if let Some(tag) = stored.get(header::ETAG) {
        request.insert(header::IF_NONE_MATCH, tag.clone());
    }
    if let Some(modified) = stored.get(header::LAST_MODIFIED) {
        request.insert(header::IF_MODIFIED_SINCE, modified.clone());
    }
}

/// The stored fields a 304 does not replace (RFC 9111 §3.2, §4.3.4): those that describe
/// the stored body's bytes — its length, coding, range and digests — and the validator it
/// was selected by. A 304 says the stored body still holds; a new label on it would send
/// the next client those bytes under another coding or tag. Varnish keeps these too.
const DESCRIBE_THE_STORED_BODY: [&str; 8] = [
    "content-length",
    "content-encoding",
    "content-range",
    "content-md5",
    "content-digest",
    "repr-digest",
    "digest",
    "etag",
];

/// The stored fields refreshed by the fields of a 304 the cache keeps: each replaces the
/// stored values of its name, but for those that describe the stored body.
pub(crate) fn refreshed(stored: &HeaderMap, not_modified: &HeaderMap) -> HeaderMap {
    let mut fields = stored.clone();
    for name in not_modified.keys() {
        if DESCRIBE_THE_STORED_BODY.contains(&name.as_str()) {
            continue;
        }
        fields.remove(name);
        for value in not_modified.get_all(name) {
            fields.append(name.clone(), value.clone());
        }
    }
    fields
}

/// The fields of a 304 made from a stored copy.
pub(crate) fn not_modified_fields(stored: &HeaderMap) -> HeaderMap {
    let mut fields = HeaderMap::with_capacity(NOT_MODIFIED_FIELDS.len() + 2);
    for name in &NOT_MODIFIED_FIELDS {
        for value in stored.get_all(name) {
            fields.append(name.clone(), value.clone());
        }
    }
    fields
}

/// The entity-tags of an `If-None-Match` value (`*` included as is); commas inside a tag's
/// quotes do not split it.
fn entity_tags(value: &[u8]) -> Vec<&[u8]> {
    let mut tags = Vec::new();
    let mut start = 0;
    let mut quoted = false;
    for (i, &byte) in value.iter().enumerate() {
        match byte {
            b'"' => quoted = !quoted,
            b',' if !quoted => {
                tags.push(value[start..i].trim_ascii());
                start = i + 1;
            }
            _ => {}
        }
    }
    tags.push(value[start..].trim_ascii());
    tags.retain(|t| !t.is_empty());
    tags
}

/// The tag without its weakness, for the weak comparison a GET's validation uses.
fn opaque(tag: &[u8]) -> &[u8] {
    tag.strip_prefix(b"W/").unwrap_or(tag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stage::cache::test_fields;

    #[test]
    fn if_none_match_compares_weakly_and_comes_before_if_modified_since() {
        let stored = test_fields(&[
            ("etag", "W/\"v2\""),
            ("last-modified", "Fri, 15 Jan 2027 07:00:00 GMT"),
        ]);
        let asks = |pairs: &[(&str, &str)]| not_modified(&test_fields(pairs), &stored);
        assert!(asks(&[("if-none-match", "\"v1\", \"v2\"")]));
        assert!(asks(&[("if-none-match", "W/\"v2\"")]));
        assert!(asks(&[("if-none-match", "*")]));
        assert!(!asks(&[("if-none-match", "\"v1\"")]));
        assert!(!asks(&[("if-none-match", "\"v2,x\"")]));
        assert!(
            !asks(&[
                ("if-none-match", "\"v1\""),
                ("if-modified-since", "Fri, 15 Jan 2027 08:00:00 GMT")
            ]),
            "If-Modified-Since is not read beside If-None-Match"
        );
        assert!(asks(&[(
            "if-modified-since",
            "Fri, 15 Jan 2027 07:00:00 GMT"
        )]));
        assert!(!asks(&[(
            "if-modified-since",
            "Fri, 15 Jan 2027 06:59:59 GMT"
        )]));
        assert!(!asks(&[("if-modified-since", "yesterday")]));
        assert!(!asks(&[]));
    }

    #[test]
    fn a_304_replaces_the_fields_it_has_but_those_describing_the_stored_body() {
        let stored = test_fields(&[
            ("content-length", "5"),
            ("cache-control", "max-age=1"),
            ("x-version", "1"),
            ("x-version", "1b"),
            ("etag", "\"a\""),
            ("content-md5", "stored"),
            ("repr-digest", "sha-256=:stored:"),
        ]);
        let answer = test_fields(&[
            ("content-length", "0"),
            ("cache-control", "max-age=60"),
            ("x-version", "2"),
            ("etag", "\"b\""),
            ("content-encoding", "gzip"),
            ("content-md5", "other"),
            ("content-range", "bytes 0-2/3"),
            ("content-digest", "sha-256=:other:"),
            ("repr-digest", "sha-256=:other:"),
            ("digest", "sha-256=other"),
        ]);
        let merged = refreshed(&stored, &answer);
        let all = |name: &str| -> Vec<&str> {
            merged
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap_or(""))
                .collect()
        };
        assert_eq!(all("content-length"), ["5"]);
        assert_eq!(all("cache-control"), ["max-age=60"]);
        assert_eq!(all("x-version"), ["2"]);
        assert_eq!(all("etag"), ["\"a\""]);
        assert_eq!(all("content-md5"), ["stored"]);
        assert_eq!(all("repr-digest"), ["sha-256=:stored:"]);
        for absent in [
            "content-encoding",
            "content-range",
            "content-digest",
            "digest",
        ] {
            assert!(all(absent).is_empty(), "{absent} came from the 304");
        }
    }

    #[test]
    fn revalidation_sends_the_copys_validators_instead_of_the_clients() {
        let mut request = test_fields(&[("if-none-match", "\"client\""), ("accept", "*/*")]);
        let taken = take_conditionals(&mut request);
        assert_eq!(
            taken.get("if-none-match").map(|v| v.as_bytes()),
            Some(&b"\"client\""[..])
        );
        assert!(!request.contains_key("if-none-match"));
        ask_if_changed(
            &mut request,
            &test_fields(&[
                ("etag", "\"a\""),
                ("last-modified", "Fri, 15 Jan 2027 07:00:00 GMT"),
            ]),
        );
        assert_eq!(
            request.get("if-none-match").map(|v| v.as_bytes()),
            Some(&b"\"a\""[..])
        );
        assert!(request.contains_key("if-modified-since") && request.contains_key("accept"));
    }
}
