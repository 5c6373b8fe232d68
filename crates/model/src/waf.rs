//! The web application firewall option of an app: whether its requests are inspected with
//! the OWASP Core Rule Set, how strictly, and what happens when inspection cannot keep up.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::{as_object, optional_integer, refuse_unknown};
use crate::ValidationError;

/// Most of a request body an app may have inspected (libmodsecurity's own body limit as the
/// router configures it): bodies past 64 KiB wait on disk for their inspection, and what
/// comes past `max_body_bytes` passes uninspected, counted.
pub const MAX_INSPECTED_BODY: u64 = 64 << 20;

/// How much of a body is inspected unless the app says otherwise: ModSecurity's recommended
/// `SecRequestBodyNoFilesLimit`. The CRS's work grows with the body (about 1.4 ms per KiB of
/// form on the benchmark machine), so more is a choice an app makes.
pub const DEFAULT_INSPECTED_BODY: u64 = 128 << 10;

/// What a match does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WafMode {
    /// Matches are logged; the request goes on.
    Detect,
    /// A request the rules block gets 403.
    Block,
}

/// When inspection cannot start or finish in time (the worker pool is full or slow).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WafOverload {
    /// Let the request through uninspected (availability first).
    Open,
    /// Answer 503 (protection first).
    Closed,
}

/// An app's WAF.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Waf {
    /// Detect or block.
    pub mode: WafMode,
    /// CRS paranoia level, 1 (few false positives) to 4.
    pub paranoia: u8,
    /// The first this many bytes of a body are inspected; the rest passes uninspected.
    pub max_body_bytes: u64,
    /// Deadline for an inspection, queueing included; per 64 KiB for a spooled body.
    pub timeout_ms: u64,
    /// What an inspection that misses its deadline or finds the pool full means.
    pub on_overload: WafOverload,
}

/// Parses the `waf` option; `Ok(None)` for `"mode": "off"`.
pub(crate) fn parse_waf(value: &Value) -> Result<Option<Waf>, ValidationError> {
    let fields = as_object(value, "")?;
    refuse_unknown(
        fields,
        &[
            "mode",
            "paranoia",
            "max_body_bytes",
            "timeout_ms",
            "on_overload",
        ],
        "",
    )?;
    let mode = match fields.get("mode").and_then(Value::as_str) {
        Some("off") => return Ok(None),
        Some("detect") => WafMode::Detect,
        Some("block") => WafMode::Block,
        _ => {
            return Err(ValidationError::new(
                "mode",
                "is required: \"off\", \"detect\" or \"block\"",
            ))
        }
    };
    let on_overload = match fields.get("on_overload") {
        None => WafOverload::Open,
        Some(v) if v.as_str() == Some("open") => WafOverload::Open,
        Some(v) if v.as_str() == Some("closed") => WafOverload::Closed,
        Some(_) => {
            return Err(ValidationError::new(
                "on_overload",
                "must be \"open\" or \"closed\"",
            ))
        }
    };
    Ok(Some(Waf {
        mode,
        paranoia: optional_integer(fields, "paranoia", 1, 4, 1)? as u8,
        max_body_bytes: optional_integer(
            fields,
            "max_body_bytes",
            0,
            MAX_INSPECTED_BODY,
            DEFAULT_INSPECTED_BODY,
        )?,
        timeout_ms: optional_integer(fields, "timeout_ms", 1, 60_000, 200)?,
        on_overload,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_off_and_refusals() {
        let waf = parse_waf(&json!({"mode": "block"}))
            .expect("valid")
            .expect("on");
        assert_eq!(
            waf,
            Waf {
                mode: WafMode::Block,
                paranoia: 1,
                max_body_bytes: DEFAULT_INSPECTED_BODY,
                timeout_ms: 200,
                on_overload: WafOverload::Open
            }
        );
        assert_eq!(parse_waf(&json!({"mode": "off"})).expect("valid"), None);
        for (spec, field) in [
            (json!({}), "mode"),
            (json!({"mode": "on"}), "mode"),
            (json!({"mode": "block", "paranoia": 5}), "paranoia"),
            (
                json!({"mode": "block", "max_body_bytes": MAX_INSPECTED_BODY + 1}),
                "max_body_bytes",
            ),
            (
                json!({"mode": "block", "on_overload": "fail"}),
                "on_overload",
            ),
            (json!({"mode": "block", "timeout_ms": 0}), "timeout_ms"),
            (json!({"mode": "block", "rules": "x"}), "rules"),
        ] {
            let err = parse_waf(&spec).expect_err(&format!("{spec} refused"));
            assert_eq!(err.field, field, "{spec}: {err}");
        }
    }
}
