//! Stage static: an app's `static_root` is tried first for GET and HEAD, like nginx's
//! `try_files $uri @cache`: a regular file under the root answers; anything else goes on to
//! the cache and the app.
//!
//! Files are opened and read on Tokio's blocking pool, never on the event loop, and sent in
//! bounded chunks. A path that resolves (through `..` or a symlink) outside the root is not
//! served.

use std::path::Path;

use http::Method;

use crate::app_files::{open_under, relative_path};
use crate::context::RequestCtx;

/// A file under an app's static root that answers a request.
pub(crate) struct StaticFile {
    pub(crate) file: tokio::fs::File,
    pub(crate) length: u64,
    pub(crate) content_type: &'static str,
    /// A HEAD request: the head only.
    pub(crate) head_only: bool,
}

/// The file that answers a `method` request for `uri_path`, when the routed app has a
/// static root and a regular file under it matches.
pub(crate) async fn find(ctx: &RequestCtx, method: &Method, uri_path: &str) -> Option<StaticFile> {
    let route = ctx.route.as_ref()?;
    let root = route.app.static_root.as_deref()?;
    let head_only = method == Method::HEAD;
    if method != Method::GET && !head_only {
        return None;
    }
    let relative = relative_path(uri_path)?;
    let (file, length, path) = open_under(Path::new(root), &relative).await?;
    Some(StaticFile {
        file,
        length,
        content_type: content_type(&path),
        head_only,
    })
}

fn content_type(path: &Path) -> &'static str {
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match extension.as_deref() {
        Some("html" | "htm") => "text/html; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("json") => "application/json",
        Some("txt") => "text/plain; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("gif") => "image/gif",
        Some("webp") => "image/webp",
        Some("ico") => "image/x-icon",
        Some("woff2") => "font/woff2",
        Some("woff") => "font/woff",
        Some("pdf") => "application/pdf",
        Some("xml") => "application/xml",
        Some("wasm") => "application/wasm",
        _ => "application/octet-stream",
    }
}
