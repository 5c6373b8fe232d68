//! The request id: the client's own when it looks like one, otherwise a fresh one.

use std::sync::Arc;

use crate::request_fields::{Fields, Known};

/// The client's `X-Request-Id` when it looks like one (so a platform's edge can trace a
/// request end to end), otherwise a fresh random id.
pub(crate) fn request_id(fields: Fields<'_>) -> Arc<str> {
    let given = fields
        .get(Known::RequestId)
        .filter(|v| {
            (20..=200).contains(&v.len())
                && v.iter().all(|&b| {
                    b.is_ascii_alphanumeric()
                        || matches!(b, b'-' | b'_' | b'.' | b'+' | b'/' | b'=')
                })
        })
        .and_then(|v| std::str::from_utf8(v).ok());
    match given {
        Some(id) => Arc::from(id),
        None => random_request_id(),
    }
}

/// 128 random bits in 32 hex digits, written directly: `format!` costs several times more,
/// on every request that brings no id of its own.
fn random_request_id() -> Arc<str> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let random = rand::random::<u128>().to_be_bytes();
    let mut digits = [0u8; 32];
    // A byte's two digits at a time: half the steps of a digit at a time (callgrind).
    for (pair, byte) in digits.chunks_exact_mut(2).zip(random) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0xf)];
    }
    // Pushing the 32 digits one char at a time cost more than the random bits themselves,
    // and `from_utf8_lossy` more than the check of 32 bytes that are all ASCII.
    std::str::from_utf8(&digits).map_or_else(|_| Arc::from(""), Arc::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request_fields;

    #[test]
    fn a_fresh_request_id_is_32_lowercase_hex_digits_and_a_given_one_is_kept() {
        let none = http::HeaderMap::new();
        let first = request_id(Fields::Map(&none));
        let second = request_id(Fields::Map(&none));
        assert_eq!(first.len(), 32, "{first}");
        assert!(
            first
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{first}"
        );
        assert_ne!(first, second);
        let mut given = http::HeaderMap::new();
        given.insert(
            "x-request-id",
            http::HeaderValue::from_static("trace-0123456789abcdef-xyz"),
        );
        assert_eq!(
            &*request_id(Fields::Map(&given)),
            "trace-0123456789abcdef-xyz"
        );
        let as_read = request_fields::from_pairs(&[("X-Request-Id", "trace-0123456789abcdef-xyz")]);
        assert_eq!(
            &*request_id(Fields::AsRead(&as_read)),
            "trace-0123456789abcdef-xyz",
            "looked up in any case"
        );
        given.insert("x-request-id", http::HeaderValue::from_static("short"));
        assert_eq!(
            request_id(Fields::Map(&given)).len(),
            32,
            "too short to be an id: replaced"
        );
    }
}
