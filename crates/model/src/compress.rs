//! An app's compression of answers (nginx's `gzip`, Caddy's `encode`, Traefik's
//! `compress`): which media types, from what size.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::{as_object, optional_integer, parse_list, refuse_unknown};
use crate::ValidationError;

/// What is compressed when an app gives no list: text, and the text-based formats of the
/// web (the types nginx's and Caddy's defaults and Cloudflare's list share).
pub const DEFAULT_COMPRESSED_TYPES: &[&str] = &[
    "text/html",
    "text/css",
    "text/plain",
    "text/xml",
    "text/javascript",
    "application/javascript",
    "application/json",
    "application/xml",
    "application/rss+xml",
    "application/atom+xml",
    "application/manifest+json",
    "application/wasm",
    "image/svg+xml",
];

/// An app's compression.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Compress {
    /// Media types compressed (`text/*` takes every subtype).
    pub types: Vec<String>,
    /// Answers announcing fewer bytes are sent as they are.
    pub min_bytes: u64,
}

impl Compress {
    /// Whether answers of `content_type` (a Content-Type value, as sent) are compressed.
    pub fn takes(&self, content_type: &[u8]) -> bool {
        let media = (content_type.split(|&b| b == b';').next())
            .unwrap_or_default()
            .trim_ascii();
        self.types.iter().any(|t| match t.strip_suffix("/*") {
            Some(top) => (media.iter().position(|&b| b == b'/'))
                .is_some_and(|slash| media[..slash].eq_ignore_ascii_case(top.as_bytes())),
            None => media.eq_ignore_ascii_case(t.as_bytes()),
        })
    }
}

pub(crate) fn parse_compress(value: &Value) -> Result<Compress, ValidationError> {
    let fields = as_object(value, "")?;
    refuse_unknown(fields, &["types", "min_bytes"], "")?;
    let types = match fields.get("types") {
        None => DEFAULT_COMPRESSED_TYPES
            .iter()
            .map(|t| t.to_string())
            .collect(),
        list => parse_list(list, "types", |t| {
            let valid = t.split_once('/').is_some_and(|(top, sub)| {
                let token = |s: &str| {
                    !s.is_empty()
                        && s.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
                };
                token(top) && (sub == "*" || token(sub))
            });
            if valid {
                Ok(t.to_ascii_lowercase())
            } else {
                Err(format!(
                    "'{t}' is not a media type (type/subtype, or type/*)"
                ))
            }
        })?,
    };
    Ok(Compress {
        types,
        min_bytes: optional_integer(fields, "min_bytes", 0, 1 << 30, 1024)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn types_and_sizes_are_read_and_refused_by_field() {
        let compress =
            parse_compress(&json!({"types": ["text/*", "application/json"], "min_bytes": 256}))
                .expect("valid");
        assert!(compress.takes(b"text/html; charset=utf-8"));
        assert!(compress.takes(b"Application/JSON"));
        assert!(!compress.takes(b"image/png"));
        assert_eq!(compress.min_bytes, 256);
        let default = parse_compress(&json!({})).expect("valid");
        assert!(default.takes(b"image/svg+xml") && !default.takes(b"image/jpeg"));
        assert_eq!(default.min_bytes, 1024);
        for (value, field) in [
            (json!({"types": ["html"]}), "types[0]"),
            (json!({"types": "text/html"}), "types"),
            (json!({"min_bytes": -1}), "min_bytes"),
            (json!({"level": 9}), "level"),
        ] {
            assert_eq!(parse_compress(&value).expect_err("refused").field, field);
        }
    }
}
