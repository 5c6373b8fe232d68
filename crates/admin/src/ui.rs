//! The dashboard at `/ui/`: three static files compiled into the binary (no build step, no
//! files to deploy), served without the token because they hold no data; every figure they
//! show comes from the API, with the token. Read-only unless the router's `admin_ui_writes`
//! setting allows writes (the API refuses a browser's writes otherwise).

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Json;
use schemars::JsonSchema;
use serde::Serialize;

use crate::AdminState;

const INDEX: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/style.css");

pub(crate) async fn index() -> Response {
    file("text/html; charset=utf-8", INDEX)
}

pub(crate) async fn script() -> Response {
    file("text/javascript; charset=utf-8", SCRIPT)
}

pub(crate) async fn style() -> Response {
    file("text/css; charset=utf-8", STYLE)
}

/// `GET /v1/ui/settings`: what the dashboard may do, so it shows write controls only when
/// the API would accept them.
pub(crate) async fn settings(State(state): State<AdminState>) -> Json<UiSettings> {
    Json(UiSettings {
        writes: state.ui_writes,
    })
}

/// What the dashboard may do.
#[derive(Serialize, JsonSchema)]
pub(crate) struct UiSettings {
    /// Whether the router takes writes made by a browser (`--admin-ui-writes on`).
    writes: bool,
}

pub(crate) async fn to_index() -> Redirect {
    Redirect::permanent("/ui/")
}

fn file(content_type: &'static str, body: &'static str) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type),
            // The page is rebuilt with the binary: a browser asks again after an upgrade.
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; style-src 'self'; img-src 'self' data:",
            ),
        ],
        body,
    )
        .into_response()
}
