//! Files under an app's static root, for every stage that reads them (static files, the
//! originals of resized images): the request path as a relative path that cannot step
//! outside the root, and a file opened only if it really lies under it (no `..`, no
//! symlink out).

use std::path::{Path, PathBuf};

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
