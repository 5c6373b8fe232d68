//! How an app's request bodies reach its backends: read whole by the router first (the
//! default, as nginx's `proxy_request_buffering on`), so a slow client never holds one of
//! the app's workers, or streamed as they come for apps that process uploads as they
//! arrive (all of them, or under some path prefixes).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::{as_object, integer_field, optional_bool, parse_list, refuse_unknown};
use crate::ValidationError;

/// Highest minimum upload rate an app may ask for, in bytes a second (100 MB/s).
pub const MAX_MIN_UPLOAD_RATE: u64 = 100_000_000;
/// Longest whole-body deadline an app may give, in seconds (a day).
pub const MAX_UPLOAD_DEADLINE_S: u64 = 86_400;

/// An app's request buffering. Stored as an object; `"request_buffering": false` in an
/// app's spec is `{"enabled": false}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RequestBuffering {
    /// Bodies are read whole before a backend is chosen (true by default).
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// Path prefixes whose bodies go on as they come (gRPC client streams, uploads
    /// processed as they arrive); at most 64.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub streaming_paths: Vec<String>,
    /// An upload must average at least this many bytes a second once its grace period is
    /// over, or it is refused with 408 (the router's `--request-body-min-rate` when
    /// absent; 0: no minimum).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_rate_bytes: Option<u64>,
    /// The whole body must be in within this many seconds, or 408 (the router's
    /// `--request-body-deadline-s` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_s: Option<u64>,
}

fn enabled() -> bool {
    true
}

impl Default for RequestBuffering {
    fn default() -> Self {
        Self {
            enabled: true,
            streaming_paths: Vec::new(),
            min_rate_bytes: None,
            deadline_s: None,
        }
    }
}

impl RequestBuffering {
    pub(crate) fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Whether a request for `path` has its body read whole first.
    pub fn buffers(&self, path: &str) -> bool {
        self.enabled
            && !self
                .streaming_paths
                .iter()
                .any(|p| path.starts_with(p.as_str()))
    }
}

pub(crate) fn parse_request_buffering(value: &Value) -> Result<RequestBuffering, ValidationError> {
    if let Value::Bool(enabled) = value {
        return Ok(RequestBuffering {
            enabled: *enabled,
            ..RequestBuffering::default()
        });
    }
    let fields = as_object(value, "")
        .map_err(|_| ValidationError::new("", "must be true, false or a JSON object"))?;
    refuse_unknown(
        fields,
        &["enabled", "streaming_paths", "min_rate_bytes", "deadline_s"],
        "",
    )?;
    let streaming_paths = match fields.get("streaming_paths") {
        None => Vec::new(),
        list => parse_list(list, "streaming_paths", |p| {
            if p.starts_with('/') && p.len() <= 1024 && p.bytes().all(|b| b.is_ascii_graphic()) {
                Ok(p.to_string())
            } else {
                Err(format!("'{p}' is not a path prefix (it starts with /)"))
            }
        })?,
    };
    Ok(RequestBuffering {
        enabled: optional_bool(fields, "enabled", true)?,
        streaming_paths,
        min_rate_bytes: integer_field(fields, "min_rate_bytes", 0, MAX_MIN_UPLOAD_RATE)?,
        deadline_s: integer_field(fields, "deadline_s", 1, MAX_UPLOAD_DEADLINE_S)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_switch_or_an_object_is_read_and_bad_fields_are_named() {
        let off = parse_request_buffering(&json!(false)).expect("a switch");
        assert!(!off.enabled && !off.buffers("/upload"));
        let some = parse_request_buffering(&json!({
            "streaming_paths": ["/stream/", "/grpc.Upload/"], "min_rate_bytes": 100,
            "deadline_s": 60
        }))
        .expect("an object");
        assert!(some.buffers("/form") && !some.buffers("/stream/video"));
        assert_eq!(
            (some.min_rate_bytes, some.deadline_s),
            (Some(100), Some(60))
        );
        for (bad, field) in [
            (json!({"streaming_paths": ["upload"]}), "streaming_paths[0]"),
            (json!({"deadline_s": 0}), "deadline_s"),
            (json!({"stream": true}), "stream"),
            (json!("yes"), ""),
        ] {
            let error = parse_request_buffering(&bad).expect_err("refused");
            assert_eq!(error.field, field, "{bad}");
        }
    }
}
