//! The dashboard at `/ui/`: three static files compiled into the binary (no build step, no
//! files to deploy), served without the token because they hold no data; every figure they
//! show comes from the API, with the token. Read-only: it writes nothing.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};

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
