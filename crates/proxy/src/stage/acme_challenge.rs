//! Stage acme_challenge, ACME HTTP-01 answers: a request over plain HTTP for
//! `/.well-known/acme-challenge/TOKEN` whose token an order of the fleet published in the
//! store, for exactly this Host, gets the key authorization, on every router and before
//! the app's own stages (so neither its HTTPS redirect nor its WAF can stand in the way).
//! Any other token goes on to the app, which may answer challenges of its own.

use switchyard_store::{acme, Store};

use crate::context::RequestCtx;

/// Where HTTP-01 challenges are asked (RFC 8555, section 8.3).
pub(crate) const PREFIX: &str = "/.well-known/acme-challenge/";

/// Longest token looked up: the CA's are 43 characters; anything much longer is not one and
/// costs no store read.
const MAX_TOKEN_LEN: usize = 128;

/// The key authorization to answer with, when this request is a CA checking a challenge
/// the fleet published.
pub(crate) async fn answer(
    method: &http::Method,
    path: &str,
    ctx: &RequestCtx,
    store: &dyn Store,
) -> Option<String> {
    if ctx.tls || !(method == http::Method::GET || method == http::Method::HEAD) {
        return None;
    }
    let token = path.strip_prefix(PREFIX)?;
    if !is_token(token) {
        return None;
    }
    let host = ctx.host.as_deref()?;
    match acme::challenge(store, token).await {
        Ok(Some(challenge)) if challenge.domain == host => Some(challenge.key_authorization),
        Ok(_) => None,
        Err(e) => {
            log::warn!("cannot read ACME challenge {token} from the store: {e}");
            None
        }
    }
}

/// ACME tokens are base64url (RFC 8555, section 8.1).
fn is_token(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= MAX_TOKEN_LEN
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::is_token;

    #[test]
    fn only_base64url_tokens_are_looked_up() {
        let cases = [
            ("LoqXcYV8q5ONbJQxbmR7SCTNo3tiAXDfowyjxAjEuX0", true),
            ("a-b_c", true),
            ("", false),
            ("a/b", false),
            ("a.b", false),
            ("a%2Fb", false),
        ];
        for (token, looked_up) in cases {
            assert_eq!(is_token(token), looked_up, "{token:?}");
        }
        assert!(!is_token(&"a".repeat(129)));
    }
}
