//! The image option of an app: originals under the app resized on request, at
//! `{prefix}{width}x{height}/{path}`, within limits that keep one request from taking a
//! worker's memory or time.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::{as_object, optional_integer, refuse_unknown};
use crate::ValidationError;

/// Largest original fetched, by default and at most.
pub const DEFAULT_MAX_SOURCE_BYTES: u64 = 10 * 1024 * 1024;
const MAX_SOURCE_BYTES: u64 = 64 * 1024 * 1024;
/// Largest output side, by default and at most.
const DEFAULT_MAX_SIDE: u64 = 2048;
const MAX_SIDE: u64 = 8192;

/// An app's image resizing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Images {
    /// Path prefix of resize requests, starting and ending with `/`.
    pub prefix: String,
    /// Originals larger than this are refused (422).
    pub max_source_bytes: u64,
    /// Largest width asked for (larger: 400).
    pub max_width: u32,
    /// Largest height asked for (larger: 400).
    pub max_height: u32,
    /// JPEG quality of outputs, 1–100.
    pub quality: u8,
    /// Deadline for the resize, queueing included (missed: 503 with `Retry-After`).
    pub timeout_ms: u64,
}

pub(crate) fn parse_images(value: &Value) -> Result<Images, ValidationError> {
    let fields = as_object(value, "")?;
    refuse_unknown(
        fields,
        &[
            "prefix",
            "max_source_bytes",
            "max_width",
            "max_height",
            "quality",
            "timeout_ms",
        ],
        "",
    )?;
    let prefix = match fields.get("prefix") {
        None => "/_img/".to_string(),
        Some(Value::String(p))
            if p.len() >= 3
                && p.len() <= 64
                && p.starts_with('/')
                && p.ends_with('/')
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'_' | b'-' | b'.')) =>
        {
            p.clone()
        }
        Some(_) => {
            return Err(ValidationError::new(
                "prefix",
                "must be a path of letters, digits, '_', '-', '.' that starts and ends with '/', e.g. \"/_img/\"",
            ))
        }
    };
    Ok(Images {
        prefix,
        max_source_bytes: optional_integer(
            fields,
            "max_source_bytes",
            1,
            MAX_SOURCE_BYTES,
            DEFAULT_MAX_SOURCE_BYTES,
        )?,
        max_width: optional_integer(fields, "max_width", 1, MAX_SIDE, DEFAULT_MAX_SIDE)? as u32,
        max_height: optional_integer(fields, "max_height", 1, MAX_SIDE, DEFAULT_MAX_SIDE)? as u32,
        quality: optional_integer(fields, "quality", 1, 100, 82)? as u8,
        timeout_ms: optional_integer(fields, "timeout_ms", 1, 60_000, 2_000)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_and_refusals_name_the_field() {
        let images = parse_images(&json!({})).expect("defaults");
        assert_eq!(images.prefix, "/_img/");
        assert_eq!(images.max_source_bytes, DEFAULT_MAX_SOURCE_BYTES);
        assert_eq!((images.max_width, images.max_height), (2048, 2048));
        for (spec, field) in [
            (json!({"prefix": "img"}), "prefix"),
            (json!({"prefix": "/"}), "prefix"),
            (json!({"prefix": "/a b/"}), "prefix"),
            (json!({"max_width": 0}), "max_width"),
            (json!({"max_height": 9000}), "max_height"),
            (json!({"quality": 101}), "quality"),
            (json!({"max_source_bytes": 0}), "max_source_bytes"),
            (json!({"timeout_ms": 0}), "timeout_ms"),
            (json!({"fit": "cover"}), "fit"),
        ] {
            let err = parse_images(&spec).expect_err(&format!("{spec} refused"));
            assert_eq!(err.field, field, "{spec}: {err}");
        }
    }
}
