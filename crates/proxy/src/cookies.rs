//! The cookies a request carries, as the stages that choose by one read them: the mirror's
//! share by cookie, the sticky session's backend.

/// The value of the cookie `name` in each of the `Cookie` fields `fields` that has it (the
/// first in each), quotes taken off, in the fields' order.
pub(crate) fn cookie_values<'h>(
    fields: impl Iterator<Item = &'h [u8]> + 'h,
    name: &'h str,
) -> impl Iterator<Item = &'h str> + 'h {
    fields
        .filter_map(|v| std::str::from_utf8(v).ok())
        .filter_map(move |cookies| cookie_value(cookies, name))
}

fn cookie_value<'c>(cookies: &'c str, name: &str) -> Option<&'c str> {
    cookies.split(';').find_map(|pair| {
        let (key, value) = pair.trim().split_once('=')?;
        (key == name).then_some(value.trim_matches('"'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::COOKIE;
    use http::{HeaderMap, HeaderValue};

    fn cookies(headers: &HeaderMap) -> impl Iterator<Item = &[u8]> {
        headers.get_all(COOKIE).iter().map(HeaderValue::as_bytes)
    }

    #[test]
    fn cookie_values_are_found_as_sent_in_every_field() {
        assert_eq!(cookie_value("sid=abc; user=\"42\"", "user"), Some("42"));
        assert_eq!(cookie_value("sid=abc", "user"), None);
        let mut headers = HeaderMap::new();
        headers.append(COOKIE, HeaderValue::from_static("theme=dark; sticky=a"));
        headers.append(COOKIE, HeaderValue::from_static("sticky=b"));
        assert_eq!(
            cookie_values(cookies(&headers), "sticky").collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(cookie_values(cookies(&headers), "none").next(), None);
    }
}
