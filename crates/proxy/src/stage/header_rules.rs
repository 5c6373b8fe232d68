//! Stage header_rules: the app's edits to the fields of its requests (before they go to a
//! backend) and of its answers (the app's, a cached copy, or the router's own). The model
//! refused any rule on a field that frames a message or that the router sets itself, so an
//! edit here cannot undo the router's forwarding fields or a message's framing.

use http::{HeaderMap, HeaderName, HeaderValue};
use switchyard_model::{App, HeaderEdits};

/// Whether the app edits its requests' fields: they are then made a map first.
pub(crate) fn edits_requests(app: &App) -> bool {
    app.headers.as_ref().is_some_and(|r| !r.request.is_empty())
}

/// Whether the app edits its answers' fields: a backend's answer is then read into a map.
pub(crate) fn edits_answers(app: &App) -> bool {
    app.headers.as_ref().is_some_and(|r| !r.response.is_empty())
}

/// The app's request rules applied to `headers`.
pub(crate) fn edit_request(app: &App, headers: &mut HeaderMap) {
    if let Some(rules) = app.headers.as_deref() {
        apply(&rules.request, headers);
    }
}

/// The app's answer rules applied to `headers`.
pub(crate) fn edit_answer(app: &App, headers: &mut HeaderMap) {
    if let Some(rules) = app.headers.as_deref() {
        apply(&rules.response, headers);
    }
}

/// Remove, then set, then append. Names and values were checked when the app was stored;
/// one that `http` still refuses is skipped rather than failing the request.
fn apply(edits: &HeaderEdits, headers: &mut HeaderMap) {
    for name in &edits.remove {
        headers.remove(name.as_str());
    }
    for (name, value) in &edits.set {
        if let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) {
            headers.insert(name, value);
        }
    }
    for (name, value) in &edits.append {
        if let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) {
            headers.append(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remove_then_set_then_append() {
        let app = switchyard_model::parse_app_spec(
            "site",
            &serde_json::json!({
                "headers": {"response": {
                    "remove": ["server"],
                    "set": {"x-frame-options": "DENY"},
                    "append": {"vary": "Origin"}
                }}
            }),
        )
        .expect("valid app");
        assert!(edits_answers(&app) && !edits_requests(&app));
        let mut headers = HeaderMap::new();
        headers.insert("server", HeaderValue::from_static("gunicorn"));
        headers.insert("x-frame-options", HeaderValue::from_static("SAMEORIGIN"));
        headers.insert("vary", HeaderValue::from_static("Accept-Encoding"));
        edit_answer(&app, &mut headers);
        assert!(!headers.contains_key("server"));
        assert_eq!(headers["x-frame-options"], "DENY");
        let vary: Vec<_> = headers.get_all("vary").iter().collect();
        assert_eq!(vary, ["Accept-Encoding", "Origin"]);
    }
}
