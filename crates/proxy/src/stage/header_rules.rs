//! Stage header_rules: the app's edits to the fields of its requests (before they go to a
//! backend) and of its answers (the app's, a cached copy, or the router's own). The model
//! refused any rule on a field that frames a message or that the router sets itself, so an
//! edit here cannot undo the router's forwarding fields or a message's framing.
//!
//! The rules' names and values are made once, when the app's route is built. A request
//! whose fields stay as read gets its edits as the backend's head is written
//! ([`FieldEdits::left_out`], [`FieldEdits::set`], [`FieldEdits::appended`]); an answer's
//! are made on its fields as read or its map alike (`FieldsMut`): neither side is made a
//! map for them.

use switchyard_model::App;

use crate::fields_mut::FieldEdits;

/// Whether the app edits its requests' fields.
pub(crate) fn edits_requests(app: &App) -> bool {
    app.headers.as_ref().is_some_and(|r| !r.request.is_empty())
}

/// Whether the app edits its answers' fields.
pub(crate) fn edits_answers(app: &App) -> bool {
    app.headers.as_ref().is_some_and(|r| !r.response.is_empty())
}

/// An app's rules of both directions, made once with its route.
#[derive(Debug)]
pub(crate) struct Rules {
    pub(crate) request: FieldEdits,
    pub(crate) answer: FieldEdits,
}

impl Rules {
    /// `app`'s rules, when it has any.
    pub(crate) fn of(app: &App) -> Option<Box<Self>> {
        let rules = app.headers.as_deref()?;
        if rules.request.is_empty() && rules.response.is_empty() {
            return None;
        }
        Some(Box::new(Self {
            request: FieldEdits::of(&rules.request),
            answer: FieldEdits::of(&rules.response),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fields_mut::FieldsMut;
    use http::{HeaderMap, HeaderValue};

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
        let rules = Rules::of(&app).expect("rules");
        assert!(rules.request.is_empty());
        let mut headers = HeaderMap::new();
        headers.insert("server", HeaderValue::from_static("gunicorn"));
        headers.insert("x-frame-options", HeaderValue::from_static("SAMEORIGIN"));
        headers.insert("vary", HeaderValue::from_static("Accept-Encoding"));
        rules.answer.apply(&mut FieldsMut::map(&mut headers));
        assert!(!headers.contains_key("server"));
        assert_eq!(headers["x-frame-options"], "DENY");
        let vary: Vec<_> = headers.get_all("vary").iter().collect();
        assert_eq!(vary, ["Accept-Encoding", "Origin"]);
        assert!(rules.answer.left_out(b"Server") && rules.answer.left_out(b"X-Frame-Options"));
        assert!(!rules.answer.left_out(b"vary"));
        assert_eq!(rules.answer.set().count(), 1);
        let appended: Vec<_> = rules.answer.appended().collect();
        assert_eq!(appended, [(&b"vary"[..], &b"Origin"[..])]);
    }
}
