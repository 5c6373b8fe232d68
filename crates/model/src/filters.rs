//! An app's proxy-wasm filters: which of the stored modules run on its requests, in order,
//! each with its configuration and limits; and the stored modules themselves, by name.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::{as_object, refuse_unknown};
use crate::ValidationError;

/// Filters one app may run.
pub const MAX_FILTERS_PER_APP: usize = 8;
/// Bytes of one filter's configuration, as it is handed to the filter.
pub const MAX_FILTER_CONFIG_BYTES: usize = 64 * 1024;
/// Bytes of one module.
pub const MAX_FILTER_MODULE_BYTES: usize = 16 * 1024 * 1024;
/// The longest CPU deadline a filter's callback may be given.
pub const MAX_FILTER_DEADLINE_MS: u32 = 1000;
/// The most memory a filter's instance may be given.
pub const MAX_FILTER_MEMORY_MIB: u32 = 256;

/// One filter on an app.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FilterUse {
    /// The stored module's name (`switchyard filters put NAME FILE`).
    pub name: String,
    /// Handed to the filter's `on_configure`: a string as it is, any other JSON value as
    /// its JSON text.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub config: Value,
    /// A filter that fails (traps, runs past its deadline or its memory) lets the request
    /// through without it; otherwise the request is answered 500.
    #[serde(default)]
    pub fail_open: bool,
    /// Its CPU deadline per callback, in milliseconds (the router's default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u32>,
    /// Its memory cap per instance, in MiB (the router's default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u32>,
}

impl FilterUse {
    /// The configuration as the filter gets it.
    pub fn config_bytes(&self) -> Vec<u8> {
        match &self.config {
            Value::Null => Vec::new(),
            Value::String(text) => text.as_bytes().to_vec(),
            other => other.to_string().into_bytes(),
        }
    }
}

/// A stored module, as the API lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FilterModule {
    /// Its name, which apps use.
    pub name: String,
    /// The SHA-256 of its bytes, hex: where the bytes are kept, and its version.
    pub sha256: String,
    /// Its size in bytes.
    pub size: u64,
    /// When it was last put, in seconds since the epoch.
    pub updated_unix: u64,
}

/// Whether `name` may name a filter: 1–64 of lowercase letters, digits, `-` and `_`.
pub fn valid_filter_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

pub(crate) fn parse_filters(value: &Value) -> Result<Vec<FilterUse>, ValidationError> {
    let items = value
        .as_array()
        .ok_or_else(|| ValidationError::new("", "must be an array of {name, config, fail_open}"))?;
    if items.len() > MAX_FILTERS_PER_APP {
        return Err(ValidationError::new(
            "",
            format!("at most {MAX_FILTERS_PER_APP} filters per app"),
        ));
    }
    let mut filters: Vec<FilterUse> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("[{i}]");
        let fields = as_object(item, &at)?;
        refuse_unknown(
            fields,
            &["name", "config", "fail_open", "deadline_ms", "memory_mib"],
            &format!("{at}."),
        )?;
        let name = match fields.get("name").and_then(Value::as_str) {
            Some(name) if valid_filter_name(name) => name.to_string(),
            _ => {
                return Err(ValidationError::new(
                    format!("{at}.name"),
                    "is required: 1-64 of a-z, 0-9, '-' and '_'",
                ))
            }
        };
        if filters.iter().any(|f| f.name == name) {
            return Err(ValidationError::new(
                format!("{at}.name"),
                "is listed twice",
            ));
        }
        let fail_open = match fields.get("fail_open") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ValidationError::new(
                    format!("{at}.fail_open"),
                    "must be true or false",
                ))
            }
        };
        let bounded = |key: &str, max: u32| -> Result<Option<u32>, ValidationError> {
            match fields.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => match v.as_u64() {
                    Some(n) if n >= 1 && n <= u64::from(max) => Ok(Some(n as u32)),
                    _ => Err(ValidationError::new(
                        format!("{at}.{key}"),
                        format!("must be an integer from 1 to {max}"),
                    )),
                },
            }
        };
        let filter = FilterUse {
            name,
            config: fields.get("config").cloned().unwrap_or(Value::Null),
            fail_open,
            deadline_ms: bounded("deadline_ms", MAX_FILTER_DEADLINE_MS)?,
            memory_mib: bounded("memory_mib", MAX_FILTER_MEMORY_MIB)?,
        };
        if filter.config_bytes().len() > MAX_FILTER_CONFIG_BYTES {
            return Err(ValidationError::new(
                format!("{at}.config"),
                format!("is longer than {MAX_FILTER_CONFIG_BYTES} bytes"),
            ));
        }
        filters.push(filter);
    }
    Ok(filters)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn filters_are_read_with_their_configuration_as_the_filter_gets_it() {
        let filters = parse_filters(&json!([
            {"name": "policy", "config": {"set": 1}},
            {"name": "signed", "config": "raw text", "fail_open": true, "deadline_ms": 5}
        ]))
        .expect("valid");
        assert_eq!(filters[0].config_bytes(), br#"{"set":1}"#);
        assert_eq!(filters[1].config_bytes(), b"raw text");
        assert!(filters[1].fail_open);
        assert_eq!(filters[1].deadline_ms, Some(5));
    }

    #[test]
    fn a_bad_filter_is_refused_naming_its_field() {
        let cases = [
            (json!([{"name": "Bad Name"}]), "[0].name"),
            (json!([{"name": "a"}, {"name": "a"}]), "[1].name"),
            (json!([{"name": "a", "deadline_ms": 0}]), "[0].deadline_ms"),
            (json!([{"name": "a", "surprise": 1}]), "[0].surprise"),
        ];
        for (value, field) in cases {
            let error = parse_filters(&value).expect_err("refused");
            assert_eq!(error.field, field, "{value}");
        }
    }
}
