//! Who may call the admin API and what they did: scoped API tokens (kept as a digest of
//! their secret, never the secret) and the audit record of every write.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ValidationError;

/// What a token may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenScope {
    /// Every read (`GET`), no write.
    Read,
    /// Every read and every write but the tokens themselves (the bootstrap
    /// `--admin-token` alone manages tokens).
    Write,
    /// Reads and writes of the apps whose names start with the prefix, and nothing else: a
    /// tenant's own deploy pipeline.
    Apps(String),
}

/// Longest app-name prefix a scope may hold (an app name's own limit).
const MAX_PREFIX: usize = 63;

impl TokenScope {
    /// `read`, `write` or `apps:PREFIX`.
    pub fn parse(text: &str) -> Result<Self, ValidationError> {
        match text {
            "read" => Ok(Self::Read),
            "write" => Ok(Self::Write),
            _ => match text.strip_prefix("apps:") {
                Some(prefix)
                    if !prefix.is_empty()
                        && prefix.len() <= MAX_PREFIX
                        && prefix
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') =>
                {
                    Ok(Self::Apps(prefix.to_string()))
                }
                _ => Err(ValidationError::new(
                    "scope",
                    format!(
                        "`{text}` is not a scope: read, write, or apps:PREFIX (lowercase \
                         letters, digits and dashes, as app names)"
                    ),
                )),
            },
        }
    }

    /// Whether the scope lets its holder change the app `name`.
    pub fn may_write_app(&self, name: &str) -> bool {
        match self {
            Self::Read => false,
            Self::Write => true,
            Self::Apps(prefix) => name.starts_with(prefix.as_str()),
        }
    }
}

impl std::fmt::Display for TokenScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Read => f.write_str("read"),
            Self::Write => f.write_str("write"),
            Self::Apps(prefix) => write!(f, "apps:{prefix}"),
        }
    }
}

/// A token as the store keeps it: the SHA-256 of its secret, never the secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ApiToken {
    /// Its public part, shown in the audit log and used to revoke it.
    pub id: String,
    /// What its holder said it is for.
    #[serde(default)]
    pub name: String,
    /// `read`, `write` or `apps:PREFIX`.
    pub scope: String,
    /// Hex SHA-256 of the secret part.
    #[schemars(skip)]
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret_sha256: String,
    /// When it was made, seconds since the epoch.
    pub created_at: u64,
}

/// One write made through the admin API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AuditRecord {
    /// Where the record sits in the log, set by the store: the cursor to page from.
    #[serde(default)]
    pub cursor: String,
    /// When the write was answered, milliseconds since the epoch.
    pub at_ms: u64,
    /// The token's id; `admin` for the router's own `--admin-token`, `anonymous` on a
    /// router that asks for none.
    pub token: String,
    /// The client's address as the router saw it.
    pub client: String,
    /// The call's method.
    pub method: String,
    /// The path called, query aside.
    pub path: String,
    /// The app the write concerns, if one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<String>,
    /// The change, field by field: `{"field": {"before": …, "after": …}}`; for a bulk
    /// write, what it touched.
    pub change: serde_json::Value,
    /// The status the write was answered with.
    pub status: u16,
}

/// A page of the audit log, newest first.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct AuditPage {
    /// The records, newest first.
    pub records: Vec<AuditRecord>,
    /// The cursor to pass as `before` for the next (older) page; absent at the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// Which records a read of the audit log wants.
#[derive(Debug, Clone, Default)]
pub struct AuditQuery {
    /// Only those of this app.
    pub app: Option<String>,
    /// Only those at or after this time, milliseconds since the epoch.
    pub since_ms: Option<u64>,
    /// Only those older than this cursor.
    pub before: Option<String>,
    /// At most this many.
    pub limit: usize,
}

impl AuditQuery {
    /// Whether `record` is one the query asks for (the cursor aside).
    pub fn wants(&self, record: &AuditRecord) -> bool {
        self.app
            .as_deref()
            .is_none_or(|app| record.app.as_deref() == Some(app))
            && self.since_ms.is_none_or(|since| record.at_ms >= since)
    }
}

/// The change between two JSON documents, one level deep: each top-level field that
/// differs, with its value before and after (`null` where absent).
pub fn field_changes(before: &serde_json::Value, after: &serde_json::Value) -> serde_json::Value {
    use serde_json::{Map, Value};
    let empty = Map::new();
    let before_fields = before.as_object().unwrap_or(&empty);
    let after_fields = after.as_object().unwrap_or(&empty);
    let mut changes = Map::new();
    for name in before_fields.keys().chain(after_fields.keys()) {
        let (was, is) = (before_fields.get(name), after_fields.get(name));
        if was != is && !changes.contains_key(name) {
            let mut change = Map::new();
            change.insert("before".into(), was.cloned().unwrap_or(Value::Null));
            change.insert("after".into(), is.cloned().unwrap_or(Value::Null));
            changes.insert(name.clone(), Value::Object(change));
        }
    }
    Value::Object(changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scopes_parse_and_bound_what_may_be_written() {
        assert_eq!(TokenScope::parse("read"), Ok(TokenScope::Read));
        let tenant = TokenScope::parse("apps:acme-").expect("a prefix scope");
        assert!(tenant.may_write_app("acme-web") && !tenant.may_write_app("other"));
        assert!(!TokenScope::Read.may_write_app("acme-web"));
        assert!(TokenScope::Write.may_write_app("anything"));
        for bad in ["admin", "apps:", "apps:Acme", "apps:a b", "READ", ""] {
            let refused = TokenScope::parse(bad).expect_err(bad);
            assert_eq!(refused.field, "scope");
        }
        assert_eq!(tenant.to_string(), "apps:acme-");
    }

    #[test]
    fn changes_name_each_field_that_moved() {
        let before = json!({"domains": ["a.com"], "backends": ["1:1"], "gone": 1});
        let after = json!({"domains": ["a.com"], "backends": ["1:2"], "new": true});
        assert_eq!(
            field_changes(&before, &after),
            json!({
                "backends": {"before": ["1:1"], "after": ["1:2"]},
                "gone": {"before": 1, "after": null},
                "new": {"before": null, "after": true},
            })
        );
        assert_eq!(field_changes(&before, &before), json!({}));
        assert_eq!(
            field_changes(&json!(null), &json!({"a": 1})),
            json!({"a": {"before": null, "after": 1}})
        );
    }
}
