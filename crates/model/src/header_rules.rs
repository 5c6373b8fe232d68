//! An app's header rules: fields set, appended or removed on the requests its backends get
//! and on the answers its clients get (security headers, CORS), never the router's own
//! fields nor those that frame a message.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::{as_object, is_token, refuse_unknown};
use crate::ValidationError;

/// Most edits in one list (`set`, `append` or `remove`) of one direction.
pub(crate) const MAX_HEADER_EDITS: usize = 32;
const MAX_NAME_LEN: usize = 128;
const MAX_VALUE_LEN: usize = 4096;

/// Fields no rule may touch on a request: those that frame it or belong to one hop, and
/// those the router itself tells the app (a rule would let a client's claim through, or
/// take away what the app's logs and rate limits rely on).
pub const PROTECTED_REQUEST_FIELDS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "x-request-id",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-port",
    "x-forwarded-host",
    "x-request-start",
    "via",
];

/// Fields no rule may touch on an answer: framing, one hop's, and the router's own.
pub const PROTECTED_RESPONSE_FIELDS: &[&str] = &[
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "trailer",
    "upgrade",
    "x-request-id",
    "x-cache",
    "age",
    "strict-transport-security",
];

/// The rules of both directions.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HeaderRules {
    /// On each request, before it goes to a backend.
    #[serde(default, skip_serializing_if = "HeaderEdits::is_empty")]
    pub request: HeaderEdits,
    /// On each answer to a client: the app's, a cached copy, or the router's own.
    #[serde(default, skip_serializing_if = "HeaderEdits::is_empty")]
    pub response: HeaderEdits,
}

/// One direction's edits, applied in this order: remove, set (in place of any field of
/// that name), append (beside any).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HeaderEdits {
    /// Lower-case names and the one value each gets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<String, String>,
    /// Lower-case names and a value added beside any the message has.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub append: BTreeMap<String, String>,
    /// Lower-case names of fields taken out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

impl HeaderEdits {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.append.is_empty() && self.remove.is_empty()
    }
}

pub(crate) fn parse_header_rules(value: &Value) -> Result<HeaderRules, ValidationError> {
    let fields = as_object(value, "")?;
    refuse_unknown(fields, &["request", "response"], "")?;
    let edits = |name: &str, protected: &[&str]| match fields.get(name) {
        None | Some(Value::Null) => Ok(HeaderEdits::default()),
        Some(v) => parse_edits(v, protected).map_err(|e| e.under(name)),
    };
    Ok(HeaderRules {
        request: edits("request", PROTECTED_REQUEST_FIELDS)?,
        response: edits("response", PROTECTED_RESPONSE_FIELDS)?,
    })
}

fn parse_edits(value: &Value, protected: &[&str]) -> Result<HeaderEdits, ValidationError> {
    let fields = as_object(value, "")?;
    refuse_unknown(fields, &["set", "append", "remove"], "")?;
    let named_values = |list: &str| -> Result<BTreeMap<String, String>, ValidationError> {
        let Some(value) = fields.get(list) else {
            return Ok(BTreeMap::new());
        };
        let entries = as_object(value, list)?;
        if entries.len() > MAX_HEADER_EDITS {
            return Err(ValidationError::new(
                list,
                format!("at most {MAX_HEADER_EDITS} fields"),
            ));
        }
        let mut out = BTreeMap::new();
        for (name, value) in entries {
            let field = format!("{list}.{name}");
            let name = field_name(name, protected).map_err(|m| ValidationError::new(&field, m))?;
            let value = value
                .as_str()
                .ok_or_else(|| ValidationError::new(&field, "must be a string"))
                .and_then(|v| field_value(v).map_err(|m| ValidationError::new(&field, m)))?;
            if out.insert(name, value).is_some() {
                return Err(ValidationError::new(
                    &field,
                    "is named twice (in another case)",
                ));
            }
        }
        Ok(out)
    };
    let set = named_values("set")?;
    let append = named_values("append")?;
    let remove = match fields.get("remove") {
        None => Vec::new(),
        Some(Value::Array(names)) if names.len() <= MAX_HEADER_EDITS => names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let field = format!("remove[{i}]");
                let name = name
                    .as_str()
                    .ok_or_else(|| ValidationError::new(&field, "must be a string"))?;
                let name =
                    field_name(name, protected).map_err(|m| ValidationError::new(&field, m))?;
                if set.contains_key(&name) {
                    return Err(ValidationError::new(
                        &field,
                        format!("'{name}' is also set: set alone replaces it"),
                    ));
                }
                Ok(name)
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ValidationError::new(
                "remove",
                format!("must be an array of at most {MAX_HEADER_EDITS} field names"),
            ))
        }
    };
    Ok(HeaderEdits {
        set,
        append,
        remove,
    })
}

/// A field name as RFC 9110 §5.1 has it (a token), lower-cased, and not a protected one.
fn field_name(name: &str, protected: &[&str]) -> Result<String, String> {
    if name.len() > MAX_NAME_LEN || !is_token(name) {
        return Err(format!(
            "'{name}' is not a field name (letters, digits and !#$%&'*+-.^_`|~, at most {MAX_NAME_LEN})"
        ));
    }
    let name = name.to_ascii_lowercase();
    if protected.contains(&name.as_str()) {
        return Err(format!(
            "'{name}' is the router's own or frames the message: no rule may change it"
        ));
    }
    Ok(name)
}

/// A field value as RFC 9110 §5.5 has it: visible characters, spaces and tabs inside, no
/// line breaks, none at either end.
fn field_value(value: &str) -> Result<String, String> {
    let allowed = |b: u8| b == b'\t' || (0x20..0x7f).contains(&b);
    if value.len() > MAX_VALUE_LEN {
        return Err(format!("at most {MAX_VALUE_LEN} bytes"));
    }
    if !value.bytes().all(allowed) {
        return Err("must be visible ASCII, spaces and tabs (no line breaks)".into());
    }
    if value.trim() != value {
        return Err("must not start or end with whitespace".into());
    }
    Ok(value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_are_read_lower_cased() {
        let rules = parse_header_rules(&json!({
            "request": {"set": {"X-Tenant": "shop"}, "remove": ["X-Debug"]},
            "response": {
                "set": {"Strict-Transport-Security-Report": "1", "X-Frame-Options": "DENY"},
                "append": {"Access-Control-Allow-Origin": "https://example.com"},
                "remove": ["server"]
            }
        }))
        .expect("valid");
        assert_eq!(rules.request.set["x-tenant"], "shop");
        assert_eq!(rules.request.remove, ["x-debug"]);
        assert_eq!(rules.response.set["x-frame-options"], "DENY");
        assert!(rules
            .response
            .append
            .contains_key("access-control-allow-origin"));
        let back: HeaderRules =
            serde_json::from_value(serde_json::to_value(&rules).expect("json")).expect("back");
        assert_eq!(back, rules);
    }

    #[test]
    fn protected_and_malformed_fields_are_refused_by_name() {
        for (rules, field) in [
            (
                json!({"request": {"remove": ["X-Request-Id"]}}),
                "request.remove[0]",
            ),
            (
                json!({"request": {"set": {"X-Forwarded-For": "1.2.3.4"}}}),
                "request.set.X-Forwarded-For",
            ),
            (
                json!({"request": {"set": {"Host": "other"}}}),
                "request.set.Host",
            ),
            (
                json!({"response": {"set": {"Content-Length": "3"}}}),
                "response.set.Content-Length",
            ),
            (
                json!({"response": {"remove": ["x-request-id"]}}),
                "response.remove[0]",
            ),
            (
                json!({"response": {"set": {"X-A": "line\r\nInjected: 1"}}}),
                "response.set.X-A",
            ),
            (
                json!({"response": {"set": {"X-A": " padded"}}}),
                "response.set.X-A",
            ),
            (
                json!({"response": {"set": {"Bad Name": "v"}}}),
                "response.set.Bad Name",
            ),
            (json!({"response": {"set": {"X-A": 1}}}), "response.set.X-A"),
            (
                json!({"response": {"set": {"x-a": "1", "X-A": "2"}}}),
                "response.set.x-a",
            ),
            (
                json!({"response": {"set": {"x-a": "1"}, "remove": ["x-a"]}}),
                "response.remove[0]",
            ),
            (json!({"response": {"delete": ["x-a"]}}), "response.delete"),
            (json!({"both": {}}), "both"),
        ] {
            let error = parse_header_rules(&rules).expect_err("refused");
            assert_eq!(error.field, field, "{rules}: {}", error.message);
        }
    }
}
