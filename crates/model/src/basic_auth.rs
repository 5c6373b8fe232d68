//! Password protection of an app (review apps, staging): HTTP Basic authentication against
//! users with bcrypt hashes in htpasswd's format (`htpasswd -B`), with paths left open for
//! health checks.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::{as_object, parse_list, refuse_unknown};
use crate::ValidationError;

/// Most users one app may list.
pub(crate) const MAX_USERS: usize = 100;
/// Highest bcrypt cost accepted: each check of an uncached password costs 2^cost rounds on
/// the worker pool (cost 12: about 0.25 s of a core), and a higher one would let one app's
/// logins take the pool from the others'.
pub const MAX_BCRYPT_COST: u32 = 12;
const MIN_BCRYPT_COST: u32 = 4;

/// An app's password protection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BasicAuth {
    /// The realm in `WWW-Authenticate`, which browsers show.
    pub realm: String,
    /// User names and their bcrypt hashes (`$2y$`, `$2b$` or `$2a$`).
    pub users: BTreeMap<String, String>,
    /// Paths answered without a password: exact, or every path under one ending in `/`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub open_paths: Vec<String>,
}

impl BasicAuth {
    /// Whether `path` is answered without a password.
    pub fn is_open(&self, path: &str) -> bool {
        self.open_paths.iter().any(|open| {
            if open.ends_with('/') {
                path.starts_with(open.as_str())
            } else {
                path == open
            }
        })
    }
}

pub(crate) fn parse_basic_auth(value: &Value) -> Result<BasicAuth, ValidationError> {
    let fields = as_object(value, "")?;
    refuse_unknown(fields, &["realm", "users", "open_paths"], "")?;
    let realm = match fields.get("realm") {
        None => "Restricted".to_string(),
        Some(Value::String(realm))
            if !realm.is_empty()
                && realm.len() <= 128
                && realm
                    .bytes()
                    .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\') =>
        {
            realm.clone()
        }
        Some(_) => {
            return Err(ValidationError::new(
                "realm",
                "must be 1 to 128 visible ASCII characters or spaces, without '\"' or '\\'",
            ))
        }
    };
    let users = fields
        .get("users")
        .ok_or_else(|| ValidationError::new("users", "is required: {\"name\": \"$2y$...\"}"))?;
    let users = as_object(users, "users")?;
    if users.is_empty() || users.len() > MAX_USERS {
        return Err(ValidationError::new(
            "users",
            format!("must list 1 to {MAX_USERS} users"),
        ));
    }
    let mut parsed = BTreeMap::new();
    for (name, hash) in users {
        let field = format!("users.{name}");
        if name.is_empty()
            || name.len() > 64
            || name.contains(':')
            || !name.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(ValidationError::new(
                &field,
                "a user name is 1 to 64 visible ASCII characters without ':'",
            ));
        }
        let hash = hash
            .as_str()
            .ok_or_else(|| ValidationError::new(&field, "must be a bcrypt hash string"))?;
        bcrypt_cost(hash).map_err(|m| ValidationError::new(&field, m))?;
        parsed.insert(name.clone(), hash.to_string());
    }
    let open_paths = parse_list(fields.get("open_paths"), "open_paths", |path| {
        if path.starts_with('/') && path.len() <= 1024 && path.bytes().all(|b| b.is_ascii_graphic())
        {
            Ok(path.to_string())
        } else {
            Err("must be a path starting with '/'".to_string())
        }
    })?;
    Ok(BasicAuth {
        realm,
        users: parsed,
        open_paths,
    })
}

/// The cost of a bcrypt hash in the modular crypt format htpasswd writes:
/// `$2y$NN$` and 53 characters of bcrypt's base64 (22 of salt, 31 of hash).
fn bcrypt_cost(hash: &str) -> Result<u32, String> {
    let not_bcrypt = || {
        "must be a bcrypt hash as `htpasswd -nbB user password` prints it after the ':' \
         ($2y$, $2b$ or $2a$, a cost, 53 characters)"
            .to_string()
    };
    let rest = ["$2y$", "$2b$", "$2a$"]
        .iter()
        .find_map(|prefix| hash.strip_prefix(prefix))
        .ok_or_else(not_bcrypt)?;
    let (cost, encoded) = rest.split_once('$').ok_or_else(not_bcrypt)?;
    let cost: u32 = match cost.as_bytes() {
        [a, b] if a.is_ascii_digit() && b.is_ascii_digit() => {
            cost.parse().map_err(|_| not_bcrypt())?
        }
        _ => return Err(not_bcrypt()),
    };
    let bcrypt_base64 = |b: u8| b.is_ascii_alphanumeric() || b == b'.' || b == b'/';
    if encoded.len() != 53 || !encoded.bytes().all(bcrypt_base64) {
        return Err(not_bcrypt());
    }
    if !(MIN_BCRYPT_COST..=MAX_BCRYPT_COST).contains(&cost) {
        return Err(format!(
            "has cost {cost}; from {MIN_BCRYPT_COST} to {MAX_BCRYPT_COST} (each check of a new \
             password takes 2^cost rounds of a worker)"
        ));
    }
    Ok(cost)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // `htpasswd -nbB -C 5 alice secret`
    const ALICE: &str = "$2y$05$O4mL2nNcQbBNrmzc6Ue2r.SyHG9pe7DHXcC8dA4xW3vbBhyqU8xJq";

    #[test]
    fn users_and_open_paths_are_read() {
        let auth = parse_basic_auth(&json!({
            "realm": "Staging",
            "users": {"alice": ALICE},
            "open_paths": ["/health", "/public/"]
        }))
        .expect("valid");
        assert_eq!(auth.realm, "Staging");
        assert!(auth.is_open("/health"));
        assert!(!auth.is_open("/health/x"));
        assert!(auth.is_open("/public/a.css"));
        assert!(!auth.is_open("/"));
    }

    #[test]
    fn bad_values_name_their_field() {
        let strong = ALICE.replacen("$05$", "$13$", 1);
        for (value, field) in [
            (json!({}), "users"),
            (json!({"users": {}}), "users"),
            (json!({"users": {"alice": "secret"}}), "users.alice"),
            (json!({"users": {"alice": "$apr1$abc$def"}}), "users.alice"),
            (json!({"users": {"alice": strong}}), "users.alice"),
            (json!({"users": {"a:b": ALICE}}), "users.a:b"),
            (
                json!({"users": {"alice": ALICE}, "realm": "say \"hi\""}),
                "realm",
            ),
            (
                json!({"users": {"alice": ALICE}, "open_paths": ["health"]}),
                "open_paths[0]",
            ),
            (
                json!({"users": {"alice": ALICE}, "password": "x"}),
                "password",
            ),
        ] {
            let error = parse_basic_auth(&value).expect_err("refused");
            assert_eq!(error.field, field, "{value}: {}", error.message);
        }
    }
}
