//! Range requests answered from a stored whole answer (RFC 9111 §3.4, RFC 9110 §14): one
//! byte range gives a 206 with its `Content-Range`, a range past the end a 416. Several
//! ranges, other units, or an `If-Range` the copy does not match get the whole answer,
//! as RFC 9110 §14.2 lets a server do.

use std::ops::Range;

use http::{header, HeaderMap};

use super::freshness::date_field;

/// What part of a stored answer of `length` bytes the request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part {
    Whole,
    Bytes(Range<usize>),
    /// No byte of it: a 416.
    Unsatisfiable,
}

/// The part `request` asks for of a copy with `stored` fields and `length` bytes.
pub(crate) fn asked(request: &HeaderMap, stored: &HeaderMap, length: usize) -> Part {
    let Some(range) = request.get(header::RANGE).and_then(|v| v.to_str().ok()) else {
        return Part::Whole;
    };
    if !if_range_holds(request, stored) {
        return Part::Whole;
    }
    let Some(spec) = range.trim().strip_prefix("bytes=") else {
        return Part::Whole;
    };
    if spec.contains(',') {
        return Part::Whole;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return Part::Whole;
    };
    let number = |text: &str| -> Option<Option<usize>> {
        let text = text.trim();
        if text.is_empty() {
            return Some(None);
        }
        if !text.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        // Past what memory can hold is past the end.
        Some(Some(text.parse().unwrap_or(usize::MAX)))
    };
    let (Some(first), Some(last)) = (number(first), number(last)) else {
        return Part::Whole;
    };
    match (first, last) {
        (Some(first), _) if first >= length => Part::Unsatisfiable,
        (Some(first), Some(last)) if last < first => Part::Whole,
        (Some(first), last) => {
            let end = last.map_or(length, |last| last.saturating_add(1).min(length));
            Part::Bytes(first..end)
        }
        (None, Some(0)) => Part::Unsatisfiable,
        (None, Some(suffix)) => Part::Bytes(length.saturating_sub(suffix)..length),
        (None, None) => Part::Whole,
    }
}

/// `If-Range` (RFC 9110 §13.1.5): the range only if the copy is the one the client has,
/// by a strong entity-tag or an exact date.
fn if_range_holds(request: &HeaderMap, stored: &HeaderMap) -> bool {
    let Some(condition) = request.get(header::IF_RANGE) else {
        return true;
    };
    let condition = condition.as_bytes();
    if condition.starts_with(b"\"") {
        return stored.get(header::ETAG).map(|tag| tag.as_bytes()) == Some(condition);
    }
    if condition.starts_with(b"W/") {
        return false;
    }
    let (Some(asked), Some(modified)) = (
        date_field(request, header::IF_RANGE),
        date_field(stored, header::LAST_MODIFIED),
    ) else {
        return false;
    };
    asked == modified
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stage::cache::test_fields;

    #[test]
    fn one_byte_range_is_a_part_and_the_rest_is_the_whole() {
        let stored = test_fields(&[
            ("etag", "\"s\""),
            ("last-modified", "Fri, 15 Jan 2027 07:00:00 GMT"),
        ]);
        let part = |range: &str| asked(&test_fields(&[("range", range)]), &stored, 100);
        assert_eq!(part("bytes=0-9"), Part::Bytes(0..10));
        assert_eq!(part("bytes=90-"), Part::Bytes(90..100));
        assert_eq!(part("bytes=95-200"), Part::Bytes(95..100));
        assert_eq!(part("bytes=-10"), Part::Bytes(90..100));
        assert_eq!(part("bytes=-500"), Part::Bytes(0..100));
        assert_eq!(part("bytes=100-"), Part::Unsatisfiable);
        assert_eq!(part("bytes=-0"), Part::Unsatisfiable);
        for whole in [
            "bytes=0-1,5-6",
            "items=0-1",
            "bytes=5-1",
            "bytes=x-1",
            "bytes=-",
        ] {
            assert_eq!(part(whole), Part::Whole, "{whole}");
        }
        let with = |condition: &str| {
            asked(
                &test_fields(&[("range", "bytes=0-0"), ("if-range", condition)]),
                &stored,
                100,
            )
        };
        assert_eq!(with("\"s\""), Part::Bytes(0..1));
        assert_eq!(with("\"t\""), Part::Whole);
        assert_eq!(with("W/\"s\""), Part::Whole, "a weak tag never matches");
        assert_eq!(with("Fri, 15 Jan 2027 07:00:00 GMT"), Part::Bytes(0..1));
        assert_eq!(with("Fri, 15 Jan 2027 08:00:00 GMT"), Part::Whole);
    }
}
