//! Sticky sessions (Heroku's session affinity, Scalingo's sticky sessions): the first answer
//! sets a cookie naming the backend that served it, by an opaque token, and the client's
//! later requests go to that backend while it is in the app and healthy.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::{as_object, integer_field, is_token, refuse_unknown};
use crate::ValidationError;

/// The cookie's name when the app gives none.
pub const DEFAULT_AFFINITY_COOKIE: &str = "switchyard_affinity";
const MAX_TTL_S: u64 = 365 * 86_400;

/// An app's session affinity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Affinity {
    /// The cookie's name.
    pub cookie: String,
    /// The cookie's `Max-Age`; a session cookie (gone when the browser closes) when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
}

pub(crate) fn parse_affinity(value: &Value) -> Result<Affinity, ValidationError> {
    let fields = as_object(value, "")?;
    refuse_unknown(fields, &["cookie", "ttl_s"], "")?;
    let cookie = match fields.get("cookie") {
        None => DEFAULT_AFFINITY_COOKIE.to_string(),
        // A cookie name is a token (RFC 6265 §4.1.1).
        Some(Value::String(name)) if name.len() <= 64 && is_token(name) => name.clone(),
        Some(_) => {
            return Err(ValidationError::new(
                "cookie",
                "must be a cookie name: 1 to 64 letters, digits and !#$%&'*+-.^_`|~",
            ))
        }
    };
    let ttl_s = integer_field(fields, "ttl_s", 1, MAX_TTL_S)?;
    Ok(Affinity { cookie, ttl_s })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_cookie_and_its_lifetime_are_read_and_refused_by_field() {
        let affinity = parse_affinity(&json!({"cookie": "route", "ttl_s": 3600})).expect("valid");
        assert_eq!(
            (affinity.cookie.as_str(), affinity.ttl_s),
            ("route", Some(3600))
        );
        let default = parse_affinity(&json!({})).expect("valid");
        assert_eq!(default.cookie, DEFAULT_AFFINITY_COOKIE);
        assert_eq!(default.ttl_s, None);
        for (value, field) in [
            (json!({"cookie": "a b"}), "cookie"),
            (json!({"cookie": ""}), "cookie"),
            (json!({"cookie": "x=y"}), "cookie"),
            (json!({"ttl_s": 0}), "ttl_s"),
            (json!({"ttl": 5}), "ttl"),
        ] {
            assert_eq!(parse_affinity(&value).expect_err("refused").field, field);
        }
    }
}
