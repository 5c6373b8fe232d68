use std::fmt;

use serde::{Deserialize, Serialize};

/// A hostname an app answers for: exact (`www.example.com`) or wildcard (`*.example.com`).
///
/// Stored lowercase without a trailing dot, so a lookup never has to normalise twice.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(try_from = "String", into = "String")]
pub struct Domain(String);

const MAX_HOSTNAME_LEN: usize = 253;
const MAX_LABEL_LEN: usize = 63;

impl Domain {
    /// What [`Domain::parse`] accepts, as a regular expression (for the OpenAPI document):
    /// DNS labels, a trailing dot allowed, `*.` in front for a wildcard. Beside it the
    /// parser bounds the whole name's length.
    pub const PATTERN: &'static str = r"^(\*\.)?([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?$";

    /// Longest domain [`Domain::parse`] accepts.
    pub const MAX_LEN: usize = MAX_HOSTNAME_LEN;

    /// Validates and normalises a domain as written by an operator.
    pub fn parse(input: &str) -> Result<Self, String> {
        let lowered = input.trim_end_matches('.').to_ascii_lowercase();
        if lowered.is_empty() {
            return Err("must not be empty".into());
        }
        if lowered.len() > MAX_HOSTNAME_LEN {
            return Err(format!("longer than {MAX_HOSTNAME_LEN} characters"));
        }
        let (is_wildcard, rest) = match lowered.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, lowered.as_str()),
        };
        let labels: Vec<&str> = rest.split('.').collect();
        if is_wildcard && labels.len() < 2 {
            return Err(
                "a wildcard needs at least two labels after '*.' (e.g. *.example.com)".into(),
            );
        }
        for label in &labels {
            validate_label(label)?;
        }
        Ok(Self(lowered))
    }

    /// The domain as stored: lowercase, `*.` prefix for wildcards.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is a `*.suffix` wildcard.
    pub fn is_wildcard(&self) -> bool {
        self.0.starts_with("*.")
    }
}

fn validate_label(label: &str) -> Result<(), String> {
    if label.is_empty() {
        return Err("has an empty label (two dots in a row?)".into());
    }
    if label.len() > MAX_LABEL_LEN {
        return Err(format!(
            "label '{label}' is longer than {MAX_LABEL_LEN} characters"
        ));
    }
    if label == "*" {
        return Err("'*' is only allowed as the first label".into());
    }
    if !label
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(format!(
            "label '{label}' may only contain a-z, 0-9 and '-' (use punycode for IDNs)"
        ));
    }
    if label.starts_with('-') || label.ends_with('-') {
        return Err(format!("label '{label}' must not start or end with '-'"));
    }
    Ok(())
}

impl TryFrom<String> for Domain {
    type Error = String;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<Domain> for String {
    fn from(value: Domain) -> Self {
        value.0
    }
}

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Turns a Host header (or SNI name) into the form domains are stored in: lowercase, no port,
/// no trailing dot. Returns `None` for a value no domain could match, so callers answer 404
/// without a store lookup.
pub fn normalize_host(host: &str) -> Option<String> {
    let without_port = if host.starts_with('[') {
        // An IPv6 literal never names an app.
        return None;
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            Some(_) => return None,
            None => host,
        }
    };
    let name = without_port.trim_end_matches('.');
    if name.is_empty() || name.len() > MAX_HOSTNAME_LEN {
        return None;
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        return None;
    }
    Some(name.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domains_are_validated_and_normalised() {
        let cases: &[(&str, Result<&str, ()>)] = &[
            ("example.com", Ok("example.com")),
            ("WWW.Example.COM.", Ok("www.example.com")),
            ("*.example.com", Ok("*.example.com")),
            ("localhost", Ok("localhost")),
            ("xn--bcher-kva.example", Ok("xn--bcher-kva.example")),
            ("*.com", Err(())),
            ("a.*.example.com", Err(())),
            ("", Err(())),
            ("a..b", Err(())),
            ("-a.example.com", Err(())),
            ("a_b.example.com", Err(())),
            ("exa mple.com", Err(())),
        ];
        for (input, expected) in cases {
            let got = Domain::parse(input);
            match expected {
                Ok(norm) => assert_eq!(got.as_ref().map(|d| d.as_str()), Ok(*norm), "{input}"),
                Err(()) => assert!(got.is_err(), "{input} should be refused, got {got:?}"),
            }
        }
        assert!(Domain::parse(&format!("{}.com", "a".repeat(64))).is_err());
    }

    #[test]
    fn hosts_are_normalised_for_lookup() {
        let cases: &[(&str, Option<&str>)] = &[
            ("Example.COM", Some("example.com")),
            ("example.com:8080", Some("example.com")),
            ("example.com.", Some("example.com")),
            ("example.com:", Some("example.com")),
            ("example.com:80x", None),
            ("[::1]:80", None),
            ("", None),
            ("exa/mple.com", None),
        ];
        for (input, expected) in cases {
            assert_eq!(normalize_host(input).as_deref(), *expected, "{input}");
        }
    }
}
