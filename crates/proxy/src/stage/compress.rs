//! Stage compress: answers compressed for clients that accept it (nginx's `gzip`, Caddy's
//! `encode`), for apps that ask.
//!
//! The coding is negotiated from the request's `Accept-Encoding` (zstd, br, gzip; the
//! client's preference, then that order), and the request's field is made that one coding
//! before the cache looks it up or the app gets it: the cache then keeps one copy per
//! coding (the answer varies on `Accept-Encoding`), and an app that compresses itself
//! answers in it. An answer already encoded, one with `Cache-Control: no-transform`, a
//! status other than 200, a type the app did not list or a length under its minimum goes
//! as it is. The body is compressed as it streams, piece by piece (each piece flushed, so
//! a slow stream is not held back), never whole; its length becomes unknown (chunked, or
//! HTTP/2 DATA frames), a strong `ETag` weak (the bytes differ), and `Vary` names
//! `Accept-Encoding`.
//!
//! The codings and their encoders: `crate::content_coding`.

use http::header::{
    ACCEPT_ENCODING, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, ETAG, VARY,
};
use http::{HeaderMap, HeaderValue};
use switchyard_model::App;

use crate::content_coding::{negotiate, Encoder};
use crate::context::RequestCtx;
use crate::metrics;

/// For an app that compresses: notes the coding this client gets, and makes the request's
/// `Accept-Encoding` that one coding (or none) for the cache and the app.
pub(crate) fn note_request(ctx: &mut RequestCtx, headers: &mut HeaderMap) {
    let coding = negotiate(
        headers
            .get_all(ACCEPT_ENCODING)
            .iter()
            .map(HeaderValue::as_bytes),
    );
    ctx.coding = coding;
    match coding {
        Some(coding) => {
            headers.insert(ACCEPT_ENCODING, HeaderValue::from_static(coding.token()));
        }
        None => {
            headers.remove(ACCEPT_ENCODING);
        }
    }
}

/// For an app that compresses, on the app's answer head: whether it is compressed (its
/// fields made so, an encoder held in `ctx` for its body); answers of a type the app
/// compresses vary on `Accept-Encoding` either way.
pub(crate) fn prepare_answer(
    app: &App,
    ctx: &mut RequestCtx,
    status: u16,
    head_only: bool,
    headers: &mut HeaderMap,
) {
    let Some(compress) = app.compress.as_ref() else {
        return;
    };
    let compressible = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| compress.takes(t));
    if !compressible {
        return;
    }
    add_vary(headers);
    let Some(coding) = ctx.coding else {
        return;
    };
    let encoded = headers
        .get(CONTENT_ENCODING)
        .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    let no_transform = headers.get_all(CACHE_CONTROL).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|d| d.trim().eq_ignore_ascii_case("no-transform"))
        })
    });
    let too_small = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        // An empty body has nothing to compress (and a stream's end would be bytes).
        .is_some_and(|length| length < compress.min_bytes.max(1));
    if status != 200 || encoded || no_transform || too_small {
        count("skipped");
        return;
    }
    if !head_only {
        match Encoder::start(coding) {
            Some(encoder) => ctx.encoder = Some(Box::new(encoder)),
            None => {
                count("busy");
                return;
            }
        }
    }
    count(coding.token());
    headers.insert(CONTENT_ENCODING, HeaderValue::from_static(coding.token()));
    headers.remove(CONTENT_LENGTH);
    if let Some(etag) = headers
        .get(ETAG)
        .filter(|e| !e.as_bytes().starts_with(b"W/"))
    {
        let mut weak = b"W/".to_vec();
        weak.extend_from_slice(etag.as_bytes());
        if let Ok(weak) = HeaderValue::from_bytes(&weak) {
            headers.insert(ETAG, weak);
        }
    }
}

/// `Vary: Accept-Encoding`, unless the answer varies on it (or on everything) already.
fn add_vary(headers: &mut HeaderMap) {
    let named = headers.get_all(VARY).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|f| f.trim() == "*" || f.trim().eq_ignore_ascii_case("accept-encoding"))
        })
    });
    if !named {
        headers.append(VARY, HeaderValue::from_static("Accept-Encoding"));
    }
}

/// Counts an answer's result in `switchyard_compress_total`.
fn count(result: &str) {
    metrics::count_result(
        &metrics::COMPRESS_BY_RESULT,
        &metrics::COMPRESS_RESULTS,
        &metrics::COMPRESS,
        result,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::content_coding::Coding;

    #[test]
    fn only_listed_unencoded_200s_of_their_minimum_size_are_compressed() {
        let app = switchyard_model::parse_app_spec(
            "site",
            &serde_json::json!({"compress": {"min_bytes": 100}}),
        )
        .expect("valid app");
        let answer = |fields: &[(&str, &str)]| {
            let mut headers = HeaderMap::new();
            for (name, value) in fields {
                headers.append(
                    http::HeaderName::from_bytes(name.as_bytes()).expect("name"),
                    HeaderValue::from_str(value).expect("value"),
                );
            }
            headers
        };
        let mut ctx = RequestCtx::new();
        ctx.coding = Some(Coding::Gzip);
        let mut html = answer(&[
            ("content-type", "text/html"),
            ("content-length", "5000"),
            ("etag", "\"v1\""),
        ]);
        prepare_answer(&app, &mut ctx, 200, false, &mut html);
        assert_eq!(html["content-encoding"], "gzip");
        assert!(!html.contains_key("content-length"));
        assert_eq!(html["etag"], "W/\"v1\"");
        assert_eq!(html["vary"], "Accept-Encoding");
        assert!(ctx.encoder.take().is_some());
        for (status, fields) in [
            (
                200,
                answer(&[("content-type", "image/png"), ("content-length", "5000")]),
            ),
            (
                200,
                answer(&[("content-type", "text/html"), ("content-length", "50")]),
            ),
            (
                200,
                answer(&[("content-type", "text/html"), ("content-encoding", "br")]),
            ),
            (
                200,
                answer(&[
                    ("content-type", "text/html"),
                    ("cache-control", "public, no-transform"),
                ]),
            ),
            (206, answer(&[("content-type", "text/html")])),
        ] {
            let mut fields = fields;
            prepare_answer(&app, &mut ctx, status, false, &mut fields);
            assert!(ctx.encoder.is_none(), "{status} {fields:?}");
            assert_ne!(
                fields.get("content-encoding").map(|v| v.as_bytes()),
                Some(&b"gzip"[..])
            );
        }
    }
}
