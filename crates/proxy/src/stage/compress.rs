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

use http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH, ETAG, VARY};
use http::{HeaderMap, HeaderValue};
use switchyard_model::App;

use crate::content_coding::{negotiate, Encoder};
use crate::context::RequestCtx;
use crate::fields_mut::FieldsMut;
use crate::metrics;
use crate::request_fields::{Fields, RequestFields};

/// For an app that compresses: notes the coding this client gets, and makes the request's
/// `Accept-Encoding` that one coding (or none) for the cache and the app: on the map, or,
/// for fields that go on as read, as the backend's head is written ([`accept_encoding`]).
pub(crate) fn note_request(
    ctx: &mut RequestCtx,
    headers: &mut HeaderMap,
    as_read: Option<&RequestFields>,
) {
    let coding = negotiate(Fields::of(headers, as_read).values(ACCEPT_ENCODING.as_str()));
    ctx.coding = coding;
    if as_read.is_some() {
        return;
    }
    match coding {
        Some(coding) => {
            headers.insert(ACCEPT_ENCODING, HeaderValue::from_static(coding.token()));
        }
        None => {
            headers.remove(ACCEPT_ENCODING);
        }
    }
}

/// The `Accept-Encoding` the backend gets in place of the client's, for fields as read:
/// the one coding noted, or none (`None`: the field is left out).
pub(crate) fn accept_encoding(ctx: &RequestCtx) -> Option<&'static str> {
    ctx.coding.map(|coding| coding.token())
}

/// For an app that compresses, on the app's answer head: whether it is compressed (its
/// fields made so, an encoder held in `ctx` for its body); answers of a type the app
/// compresses vary on `Accept-Encoding` either way.
pub(crate) fn prepare_answer(
    app: &App,
    ctx: &mut RequestCtx,
    status: u16,
    head_only: bool,
    fields: &mut FieldsMut<'_>,
) {
    let Some(compress) = app.compress.as_ref() else {
        return;
    };
    let read = Answer::read(fields);
    let compressible = read.content_type.is_some_and(|t| compress.takes(t));
    if !compressible {
        return;
    }
    // An empty body has nothing to compress (and a stream's end would be bytes).
    let too_small = read.length.is_some_and(|l| l < compress.min_bytes.max(1));
    let left_as_it_is = status != 200 || read.encoded || read.no_transform || too_small;
    if !read.varies_on_coding {
        fields.append(VARY, HeaderValue::from_static("Accept-Encoding"));
    }
    let Some(coding) = ctx.coding else {
        return;
    };
    if left_as_it_is {
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
    fields.insert(CONTENT_ENCODING, HeaderValue::from_static(coding.token()));
    fields.remove(&CONTENT_LENGTH);
    let weak_etag = (fields.get(&ETAG))
        .filter(|etag| !etag.starts_with(b"W/"))
        .and_then(|etag| HeaderValue::from_bytes(&[b"W/", etag].concat()).ok());
    if let Some(weak) = weak_etag {
        fields.insert(ETAG, weak);
    }
}

/// What the answer's fields say for compression, read in one walk of them.
#[derive(Default)]
struct Answer<'f> {
    content_type: Option<&'f [u8]>,
    /// A coding other than identity.
    encoded: bool,
    no_transform: bool,
    length: Option<u64>,
    /// `Vary` names `Accept-Encoding` (or everything) already.
    varies_on_coding: bool,
}

impl<'f> Answer<'f> {
    fn read(fields: &'f FieldsMut<'_>) -> Self {
        let mut answer = Answer::default();
        let is = |name: &[u8], known: &[u8]| name.eq_ignore_ascii_case(known);
        let listed = |value: &[u8], token: &dyn Fn(&[u8]) -> bool| {
            value.split(|&b| b == b',').any(|t| token(t.trim_ascii()))
        };
        fields.each(|name, value| match name.len() {
            4 if is(name, b"vary") => {
                answer.varies_on_coding |= listed(value, &|t| {
                    t == b"*" || t.eq_ignore_ascii_case(b"accept-encoding")
                });
            }
            12 if is(name, b"content-type") => {
                answer.content_type = answer.content_type.or(Some(value));
            }
            13 if is(name, b"cache-control") => {
                answer.no_transform |= listed(value, &|d| d.eq_ignore_ascii_case(b"no-transform"));
            }
            14 if is(name, b"content-length") && answer.length.is_none() => {
                answer.length = switchyard_h1::content_length_value(value);
            }
            16 if is(name, b"content-encoding") => {
                answer.encoded |= !value.eq_ignore_ascii_case(b"identity");
            }
            _ => {}
        });
        answer
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
        prepare_answer(&app, &mut ctx, 200, false, &mut FieldsMut::map(&mut html));
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
            prepare_answer(
                &app,
                &mut ctx,
                status,
                false,
                &mut FieldsMut::map(&mut fields),
            );
            assert!(ctx.encoder.is_none(), "{status} {fields:?}");
            assert_ne!(
                fields.get("content-encoding").map(|v| v.as_bytes()),
                Some(&b"gzip"[..])
            );
        }
    }
}
