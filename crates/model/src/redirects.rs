//! An app's redirects, answered before its backends: a host of the app moved to another
//! (www → apex, an old domain → the new one), a path prefix moved, or both. The path and
//! query go with the client, as Heroku's and Clever Cloud's documented moves do.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::{as_object, refuse_unknown};
use crate::{Domain, ValidationError};

/// Most redirects one app may list: matched in order on its requests.
pub const MAX_REDIRECTS: usize = 100;
const MAX_TARGET_LEN: usize = 2048;
const STATUSES: [u16; 4] = [301, 302, 307, 308];

/// One redirect: the requests it takes, where they go and with which status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Redirect {
    /// The exact host taken (one of the app's domains, or under one of its wildcards);
    /// `None`: every host of the app.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<Domain>,
    /// The path prefix taken, on a segment boundary (`/blog` takes `/blog` and `/blog/x`,
    /// not `/blogs`); `None`: every path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// Where to: `https://host[:port][/path]`, or, for a path-prefix redirect, a path on
    /// the same host. The rest of the request's path (after the prefix) and its query are
    /// appended.
    pub to: String,
    /// 301, 302, 307 or 308.
    pub status: u16,
}

impl Redirect {
    /// The `Location` for a request to `host` (normalised) at `path` with `query`, when this
    /// redirect takes it.
    pub fn location(&self, host: &str, path: &str, query: Option<&str>) -> Option<String> {
        if self.host.as_ref().is_some_and(|h| h.as_str() != host) {
            return None;
        }
        let rest = match &self.path_prefix {
            None => path,
            Some(prefix) => rest_after(prefix, path)?,
        };
        let mut location = String::with_capacity(self.to.len() + rest.len() + 1);
        location.push_str(&self.to);
        match (self.to.ends_with('/'), rest.starts_with('/')) {
            (true, true) => location.push_str(&rest[1..]),
            (false, false) if !rest.is_empty() => {
                location.push('/');
                location.push_str(rest);
            }
            _ => location.push_str(rest),
        }
        if let Some(query) = query {
            location.push('?');
            location.push_str(query);
        }
        Some(location)
    }
}

/// What follows `prefix` in `path` when `path` is under it, on a segment boundary.
fn rest_after<'p>(prefix: &str, path: &'p str) -> Option<&'p str> {
    let rest = path.strip_prefix(prefix)?;
    (prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/')).then_some(rest)
}

/// Parses `redirects`, given the app's `domains` (a redirect's host must be one of them).
pub(crate) fn parse_redirects(
    value: &Value,
    domains: &[Domain],
) -> Result<Vec<Redirect>, ValidationError> {
    let items = value
        .as_array()
        .ok_or_else(|| ValidationError::new("", "must be an array of redirects"))?;
    if items.len() > MAX_REDIRECTS {
        return Err(ValidationError::new(
            "",
            format!("at most {MAX_REDIRECTS} redirects per app"),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| parse_redirect(item, domains).map_err(|e| e.under(&format!("[{i}]"))))
        .collect()
}

fn parse_redirect(value: &Value, domains: &[Domain]) -> Result<Redirect, ValidationError> {
    let fields = as_object(value, "")?;
    refuse_unknown(fields, &["host", "path_prefix", "to", "status"], "")?;
    let host = match fields.get("host") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => {
            let host = Domain::parse(text).map_err(|m| ValidationError::new("host", m))?;
            if host.is_wildcard() {
                return Err(ValidationError::new(
                    "host",
                    "must be an exact host, not a wildcard",
                ));
            }
            if !domains.iter().any(|d| owns(d, host.as_str())) {
                return Err(ValidationError::new(
                    "host",
                    format!("'{host}' is not one of the app's domains"),
                ));
            }
            Some(host)
        }
        Some(_) => return Err(ValidationError::new("host", "must be a string")),
    };
    let path_prefix = match fields.get("path_prefix") {
        None | Some(Value::Null) => None,
        Some(Value::String(p)) if is_path(p) => Some(p.clone()),
        Some(_) => {
            return Err(ValidationError::new(
                "path_prefix",
                "must be a path starting with '/' (no query, fragment, spaces or control \
                 characters), e.g. \"/blog\"",
            ))
        }
    };
    if host.is_none() && path_prefix.is_none() {
        return Err(ValidationError::new(
            "host",
            "a redirect needs a host, a path_prefix or both",
        ));
    }
    let to = match fields.get("to") {
        Some(Value::String(to)) => to.clone(),
        Some(_) => return Err(ValidationError::new("to", "must be a string")),
        None => return Err(ValidationError::new("to", "is required")),
    };
    let target =
        parse_target(&to, path_prefix.is_some()).map_err(|m| ValidationError::new("to", m))?;
    if let Some(reason) = loops(&target, host.as_ref(), path_prefix.as_deref()) {
        return Err(ValidationError::new("to", reason));
    }
    let status = match fields.get("status") {
        None => 301,
        Some(v) => match v.as_u64().and_then(|s| u16::try_from(s).ok()) {
            Some(s) if STATUSES.contains(&s) => s,
            _ => {
                return Err(ValidationError::new(
                    "status",
                    "must be 301, 302, 307 or 308",
                ))
            }
        },
    };
    Ok(Redirect {
        host,
        path_prefix,
        to,
        status,
    })
}

/// Whether `domain` (exact or wildcard) covers `host`.
fn owns(domain: &Domain, host: &str) -> bool {
    match domain.as_str().strip_prefix("*.") {
        Some(parent) => host
            .strip_suffix(parent)
            .is_some_and(|label| label.ends_with('.') && !label[..label.len() - 1].contains('.')),
        None => domain.as_str() == host,
    }
}

fn is_path(text: &str) -> bool {
    text.starts_with('/')
        && text.len() <= MAX_TARGET_LEN
        && text
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'?' | b'#' | b'"' | b'<' | b'>' | b'\\'))
}

/// A redirect's target, read: its host (none for a path on the same host) and its path.
struct Target<'t> {
    host: Option<String>,
    path: &'t str,
}

fn parse_target(to: &str, path_allowed: bool) -> Result<Target<'_>, String> {
    if to.starts_with('/') {
        if !path_allowed {
            return Err("a host redirect goes to a URL, e.g. \"https://example.com\"".into());
        }
        if to.starts_with("//") || !is_path(to) {
            return Err("must be a path starting with '/' (no query or fragment)".into());
        }
        return Ok(Target {
            host: None,
            path: to,
        });
    }
    let rest = to
        .strip_prefix("https://")
        .or_else(|| to.strip_prefix("http://"))
        .ok_or("must start with https://, http:// or (for a path_prefix redirect) '/'")?;
    if to.len() > MAX_TARGET_LEN {
        return Err(format!("at most {MAX_TARGET_LEN} characters"));
    }
    let (authority, path) = match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, ""),
    };
    let host = match authority.rsplit_once(':') {
        Some((host, port)) => {
            port.parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("'{port}' is not a port"))?;
            host
        }
        None => authority,
    };
    let host = Domain::parse(host).map_err(|m| format!("the host {m}"))?;
    if host.is_wildcard() {
        return Err("the host must not be a wildcard".into());
    }
    if !path.is_empty() && !is_path(path) {
        return Err("the path must have no query, fragment, spaces or control characters".into());
    }
    Ok(Target {
        host: Some(host.as_str().to_string()),
        path,
    })
}

/// Why a redirect would send a client back to itself, if it would.
fn loops(target: &Target<'_>, host: Option<&Domain>, prefix: Option<&str>) -> Option<String> {
    let same_host = match (&target.host, host) {
        (None, _) => true,
        (Some(to), Some(from)) => to == from.as_str(),
        // Any host of the app: a target on another host may still be one of them, which
        // the app's own routing then answers; only a path overlap is sure to loop.
        (Some(_), None) => false,
    };
    if !same_host {
        return None;
    }
    match prefix {
        None => Some("redirects the host to itself: every request would come back".into()),
        Some(prefix) if rest_after(prefix, target.path).is_some() => Some(format!(
            "'{}' is under '{prefix}' again: every request would come back",
            target.path
        )),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn domains() -> Vec<Domain> {
        ["example.com", "www.example.com", "*.old.example.net"]
            .into_iter()
            .map(|d| Domain::parse(d).expect("domain"))
            .collect()
    }

    #[test]
    fn www_to_apex_keeps_path_and_query() {
        let redirects = parse_redirects(
            &json!([{"host": "www.example.com", "to": "https://example.com", "status": 308}]),
            &domains(),
        )
        .expect("valid");
        let r = &redirects[0];
        assert_eq!(
            r.location("www.example.com", "/a/b", Some("x=1"))
                .as_deref(),
            Some("https://example.com/a/b?x=1")
        );
        assert_eq!(r.location("example.com", "/a", None), None);
        assert_eq!(r.status, 308);
    }

    #[test]
    fn a_path_prefix_moves_on_segment_boundaries() {
        let redirects = parse_redirects(
            &json!([{"path_prefix": "/blog", "to": "https://blog.example.org/posts"}]),
            &domains(),
        )
        .expect("valid");
        let r = &redirects[0];
        assert_eq!(r.status, 301, "the default");
        assert_eq!(
            r.location("example.com", "/blog/2024/x", None).as_deref(),
            Some("https://blog.example.org/posts/2024/x")
        );
        assert_eq!(
            r.location("example.com", "/blog", Some("p=2")).as_deref(),
            Some("https://blog.example.org/posts?p=2")
        );
        assert_eq!(r.location("example.com", "/blogs", None), None);
        let relative = parse_redirects(
            &json!([{"path_prefix": "/old/", "to": "/new/"}]),
            &domains(),
        )
        .expect("valid");
        assert_eq!(
            relative[0]
                .location("example.com", "/old/a", None)
                .as_deref(),
            Some("/new/a")
        );
    }

    #[test]
    fn bad_redirects_name_their_field() {
        for (redirect, field) in [
            (
                json!({"host": "nope.example.com", "to": "https://example.com"}),
                "[0].host",
            ),
            (
                json!({"host": "*.example.com", "to": "https://example.com"}),
                "[0].host",
            ),
            (json!({"to": "https://example.com"}), "[0].host"),
            (
                json!({"host": "www.example.com", "to": "ftp://example.com"}),
                "[0].to",
            ),
            (
                json!({"host": "www.example.com", "to": "/relative"}),
                "[0].to",
            ),
            (
                json!({"host": "www.example.com", "to": "https://www.example.com"}),
                "[0].to",
            ),
            (json!({"path_prefix": "/a", "to": "/a/b"}), "[0].to"),
            (
                json!({"host": "www.example.com", "to": "https://example.com/?q"}),
                "[0].to",
            ),
            (
                json!({"host": "www.example.com", "to": "https://example.com", "status": 303}),
                "[0].status",
            ),
            (
                json!({"path_prefix": "blog", "to": "/b"}),
                "[0].path_prefix",
            ),
            (
                json!({"host": "www.example.com", "to": "https://example.com", "code": 301}),
                "[0].code",
            ),
        ] {
            let error = parse_redirects(&json!([redirect]), &domains()).expect_err("refused");
            assert_eq!(error.field, field, "{redirect}: {}", error.message);
        }
    }

    #[test]
    fn a_host_under_a_wildcard_of_the_app_may_move() {
        let redirects = parse_redirects(
            &json!([{"host": "shop.old.example.net", "to": "https://example.com/shop"}]),
            &domains(),
        )
        .expect("valid");
        assert_eq!(
            redirects[0]
                .location("shop.old.example.net", "/", None)
                .as_deref(),
            Some("https://example.com/shop/")
        );
        assert!(parse_redirects(
            &json!([{"host": "a.b.old.example.net", "to": "https://example.com"}]),
            &domains()
        )
        .is_err());
    }
}
