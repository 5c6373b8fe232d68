//! An app's own pages in place of the router's: a maintenance page answered while the app
//! is switched off (Heroku's `MAINTENANCE_PAGE_URL`), and the pages of the router's own
//! 502, 503 and 504 for the app (Heroku's `ERROR_PAGE_URL`). Kept in the store with the
//! app, so every router of a fleet answers them without asking anything else: a maintenance
//! page given by URL is fetched once, by the admin API when the app is written.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::{as_object, integer_field, optional_bool, refuse_unknown};
use crate::ValidationError;

/// Largest page kept: the store holds it with the app, every router holds it in memory.
pub const MAX_PAGE_BYTES: usize = 64 * 1024;
/// Statuses of the router's own answers an app may give a page to.
pub const ERROR_PAGE_STATUSES: [u16; 3] = [502, 503, 504];

/// An app switched off for maintenance: 503 with its page, its backends left alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Maintenance {
    /// Whether requests get the maintenance answer now.
    pub enabled: bool,
    /// The page HTML clients get; the router's plain text when `None`. For a page given
    /// by `page_url`, the copy fetched when the app was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_html: Option<String>,
    /// Where the page is fetched from when the app is written (by the admin API, once:
    /// every router then answers the stored copy without asking anything else).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_url: Option<String>,
    /// `Retry-After` in seconds, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u32>,
}

/// The app's pages for the router's own 502, 503 and 504, by status.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(transparent)]
pub struct ErrorPages(pub BTreeMap<u16, String>);

impl ErrorPages {
    /// The page for `status`, if the app gave one.
    pub fn page(&self, status: u16) -> Option<&str> {
        self.0.get(&status).map(String::as_str)
    }
}

pub(crate) fn parse_maintenance(value: &Value) -> Result<Maintenance, ValidationError> {
    let fields = as_object(value, "")?;
    refuse_unknown(
        fields,
        &["enabled", "page_html", "page_url", "retry_after_s"],
        "",
    )?;
    let enabled = optional_bool(fields, "enabled", false)?;
    let page_html = match fields.get("page_html") {
        None | Some(Value::Null) => None,
        Some(v) => Some(parse_page(v).map_err(|m| ValidationError::new("page_html", m))?),
    };
    let page_url = match fields.get("page_url") {
        None | Some(Value::Null) => None,
        Some(v) => Some(parse_page_url(v).map_err(|m| ValidationError::new("page_url", m))?),
    };
    let retry_after_s = integer_field(fields, "retry_after_s", 1, 86_400)?.map(|s| s as u32);
    Ok(Maintenance {
        enabled,
        page_html,
        page_url,
        retry_after_s,
    })
}

pub(crate) fn parse_error_pages(value: &Value) -> Result<ErrorPages, ValidationError> {
    let fields = as_object(value, "")?;
    let mut pages = BTreeMap::new();
    for (key, page) in fields {
        let status = key
            .parse::<u16>()
            .ok()
            .filter(|s| ERROR_PAGE_STATUSES.contains(s))
            .ok_or_else(|| {
                ValidationError::new(
                    key,
                    "must be \"502\", \"503\" or \"504\": the router's own answers",
                )
            })?;
        pages.insert(
            status,
            parse_page(page).map_err(|m| ValidationError::new(key, m))?,
        );
    }
    Ok(ErrorPages(pages))
}

/// Longest page URL taken.
const MAX_PAGE_URL_BYTES: usize = 2048;

/// An absolute `http` or `https` URL with a host; what it answers is checked when fetched.
fn parse_page_url(value: &Value) -> Result<String, String> {
    let url = value
        .as_str()
        .ok_or("must be a string: an http or https URL")?;
    if url.len() > MAX_PAGE_URL_BYTES {
        return Err(format!(
            "is {} bytes; at most {MAX_PAGE_URL_BYTES}",
            url.len()
        ));
    }
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or("must start with https:// or http://")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.is_empty() || authority.contains('@') {
        return Err("must name a host (and no user or password)".into());
    }
    if url.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return Err("must not hold spaces or control characters".into());
    }
    Ok(url.to_string())
}

fn parse_page(value: &Value) -> Result<String, String> {
    let page = value.as_str().ok_or("must be a string of HTML")?;
    if page.len() > MAX_PAGE_BYTES {
        return Err(format!("is {} bytes; at most {MAX_PAGE_BYTES}", page.len()));
    }
    if page.trim().is_empty() {
        return Err("must not be empty".into());
    }
    Ok(page.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn maintenance_and_error_pages_are_read_and_refused_by_field() {
        let maintenance = parse_maintenance(
            &json!({"enabled": true, "page_html": "<h1>Back soon</h1>", "retry_after_s": 120}),
        )
        .expect("valid");
        assert!(maintenance.enabled);
        assert_eq!(maintenance.retry_after_s, Some(120));
        let fetched = parse_maintenance(
            &json!({"enabled": true, "page_url": "https://status.example.com/down.html?x=1"}),
        )
        .expect("valid");
        assert_eq!(
            fetched.page_url.as_deref(),
            Some("https://status.example.com/down.html?x=1")
        );
        let pages =
            parse_error_pages(&json!({"502": "<p>down</p>", "504": "<p>slow</p>"})).expect("valid");
        assert_eq!(pages.page(502), Some("<p>down</p>"));
        assert_eq!(pages.page(503), None);
        let round_trip: ErrorPages =
            serde_json::from_value(serde_json::to_value(&pages).expect("json")).expect("back");
        assert_eq!(round_trip, pages);

        for (value, field) in [
            (json!({"enabled": "yes"}), "enabled"),
            (json!({"page_html": 3}), "page_html"),
            (
                json!({"page_html": "x".repeat(MAX_PAGE_BYTES + 1)}),
                "page_html",
            ),
            (json!({"retry_after_s": 0}), "retry_after_s"),
            (
                json!({"page_url": "ftp://example.com/down.html"}),
                "page_url",
            ),
            (json!({"page_url": "https://"}), "page_url"),
            (json!({"page_url": "https://u:p@example.com/"}), "page_url"),
            (json!({"page_url": "https://example.com/a b"}), "page_url"),
            (json!({"enable": true}), "enable"),
        ] {
            assert_eq!(parse_maintenance(&value).expect_err("refused").field, field);
        }
        for (value, field) in [
            (json!({"500": "<p>x</p>"}), "500"),
            (json!({"502": ""}), "502"),
            (json!({"504": {"html": "x"}}), "504"),
        ] {
            assert_eq!(parse_error_pages(&value).expect_err("refused").field, field);
        }
    }
}
