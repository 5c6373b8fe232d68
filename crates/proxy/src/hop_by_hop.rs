//! The fields that belong to one connection (RFC 9110 §7.6.1), and those a message's
//! `Connection` fields name: the router's own copies of a message — a mirrored request, a
//! cached answer — never carry them on.

use http::{header, HeaderMap, HeaderName, HeaderValue};

/// Hop-by-hop by definition, whatever `Connection` says.
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The end-to-end fields of `headers`: neither hop-by-hop nor named in its `Connection`.
pub(crate) fn end_to_end(headers: &HeaderMap) -> impl Iterator<Item = (&HeaderName, &HeaderValue)> {
    let nominated: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|token| token.trim().to_ascii_lowercase())
        .collect();
    headers.iter().filter(move |(name, _)| {
        let name = name.as_str();
        !HOP_BY_HOP.contains(&name) && !nominated.iter().any(|n| n == name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_fields_and_those_connection_names_are_left_out() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "X-Trace, keep-alive"),
            ("keep-alive", "timeout=5"),
            ("x-trace", "1"),
            ("te", "trailers"),
            ("etag", "\"v\""),
        ] {
            headers.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let kept: Vec<&str> = end_to_end(&headers).map(|(n, _)| n.as_str()).collect();
        assert_eq!(kept, ["etag"]);
    }
}
