//! Entity tags of stored records (RFC 9110 §8.8.3), for optimistic concurrency: a client
//! reads a record with its tag and writes with `If-Match`, so a write never overwrites a
//! change it did not see. A tag is a digest of the record as stored, the same in every store
//! and on every router, with no counter to keep.

use serde::Serialize;

/// The strong entity tag of `record` as stored: `"` + 32 hex digits of the SHA-256 of its
/// JSON + `"`.
pub fn entity_tag_of(record: &impl Serialize) -> String {
    let json = serde_json::to_vec(record).unwrap_or_default();
    let digest = openssl::sha::sha256(&json);
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("\"{hex}\"")
}

/// An `If-Match` precondition (RFC 9110 §13.1.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfMatch {
    /// `*`: any stored record.
    Any,
    /// One of these strong tags; a weak tag (`W/"…"`) never matches (strong comparison).
    Tags(Vec<String>),
}

impl IfMatch {
    /// Reads the header's value: `*`, or a comma-separated list of entity tags.
    pub fn parse(value: &str) -> Self {
        if value.trim() == "*" {
            return Self::Any;
        }
        Self::Tags(
            value
                .split(',')
                .map(str::trim)
                .filter(|tag| !tag.is_empty())
                .map(str::to_string)
                .collect(),
        )
    }

    /// Whether a record stored with `current` (`None`: none stored) satisfies it.
    pub fn matches(&self, current: Option<&str>) -> bool {
        match (self, current) {
            (_, None) => false,
            (Self::Any, Some(_)) => true,
            (Self::Tags(tags), Some(current)) => tags.iter().any(|tag| tag == current),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_compare_strongly_and_never_match_an_absent_record() {
        let tag = entity_tag_of(&serde_json::json!({"name": "shop"}));
        assert_eq!(tag.len(), 34);
        assert_eq!(tag, entity_tag_of(&serde_json::json!({"name": "shop"})));
        assert_ne!(tag, entity_tag_of(&serde_json::json!({"name": "shop2"})));
        assert!(IfMatch::parse(&format!("\"x\", {tag}")).matches(Some(&tag)));
        assert!(!IfMatch::parse(&format!("W/{tag}")).matches(Some(&tag)));
        assert!(IfMatch::parse(" * ").matches(Some(&tag)));
        assert!(!IfMatch::parse("*").matches(None));
        assert!(!IfMatch::parse(&tag).matches(None));
    }
}
