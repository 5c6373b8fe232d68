//! Stage static: an app's `static_root` is tried first for GET and HEAD, like nginx's
//! `try_files $uri @cache`: a regular file under the root answers; anything else goes on to
//! the cache and the app.
//!
//! Files are opened and read on Tokio's blocking pool, never on the event loop, and sent in
//! bounded chunks. A path that resolves (through `..` or a symlink) outside the root is not
//! served.

use std::path::{Path, PathBuf};

use http::Method;

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

/// The request path as a relative file path: percent-decoded, `index.html` for a
/// directory, and `None` for anything that could step outside the root.
pub(crate) fn relative_path(uri_path: &str) -> Option<PathBuf> {
    let decoded = percent_decode(uri_path)?;
    let mut relative = PathBuf::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => continue,
            ".." => return None,
            s if s.contains('\0') || s.contains('\\') => return None,
            s => relative.push(s),
        }
    }
    if decoded.ends_with('/') || relative.as_os_str().is_empty() {
        relative.push("index.html");
    }
    Some(relative)
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Opens `relative` under `root` if it is a regular file that really lies under the root.
pub(crate) async fn open_under(
    root: &Path,
    relative: &Path,
) -> Option<(tokio::fs::File, u64, PathBuf)> {
    let root = tokio::fs::canonicalize(root).await.ok()?;
    let path = tokio::fs::canonicalize(root.join(relative)).await.ok()?;
    if !path.starts_with(&root) {
        return None;
    }
    let file = tokio::fs::File::open(&path).await.ok()?;
    let metadata = file.metadata().await.ok()?;
    metadata.is_file().then_some((file, metadata.len(), path))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_paths_map_inside_the_root_only() {
        assert_eq!(relative_path("/a/b.css"), Some(PathBuf::from("a/b.css")));
        assert_eq!(relative_path("/"), Some(PathBuf::from("index.html")));
        assert_eq!(
            relative_path("/docs/"),
            Some(PathBuf::from("docs/index.html"))
        );
        assert_eq!(relative_path("/a%20b.txt"), Some(PathBuf::from("a b.txt")));
        assert_eq!(relative_path("/../etc/passwd"), None);
        assert_eq!(relative_path("/a/%2e%2e/%2e%2e/etc/passwd"), None);
        assert_eq!(relative_path("/a%00b"), None);
        assert_eq!(relative_path("/bad%zz"), None);
    }
}
