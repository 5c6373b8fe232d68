//! Who is calling, and whether their token's scope allows the call. The router's own
//! `--admin-token` is the bootstrap admin: it alone manages tokens. Every other token lives in
//! the store (shared by a fleet on Redis) as the SHA-256 of its secret, so a copy of the
//! store or of a backup never yields a usable token, and is checked on each call, so a
//! revoked token stops working at once on every router.

use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use switchyard_model::TokenScope;

use crate::{AdminState, ApiError};

/// The audit log's name for the bootstrap `--admin-token`.
pub(crate) const BOOTSTRAP_ID: &str = "admin";
/// The audit log's name for a caller of a router that asks for no token.
pub(crate) const ANONYMOUS_ID: &str = "anonymous";
/// What a stored token starts with: `sy_ID_SECRET`.
pub(crate) const TOKEN_PREFIX: &str = "sy_";

/// The caller of a call that passed [`authenticate`].
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    /// The token's id, or [`BOOTSTRAP_ID`] / [`ANONYMOUS_ID`].
    pub(crate) id: String,
    /// `None`: every call, tokens included.
    pub(crate) scope: Option<TokenScope>,
}

/// Finds the caller from the bearer token, refuses what its scope does not allow, and
/// leaves the [`Caller`] in the request for the audit record.
pub(crate) async fn authenticate(
    State(state): State<AdminState>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let given = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let bootstrap = |given: &str| {
        state
            .token
            .as_ref()
            .is_some_and(|expected| constant_time_eq(given.as_bytes(), expected.as_bytes()))
    };
    let caller = match given {
        Some(given) if bootstrap(given) => Caller {
            id: BOOTSTRAP_ID.into(),
            scope: None,
        },
        Some(given) if given.starts_with(TOKEN_PREFIX) => stored_caller(&state, given).await?,
        _ if state.token.is_none() => Caller {
            id: ANONYMOUS_ID.into(),
            scope: None,
        },
        _ => return Err(ApiError::Unauthorized),
    };
    authorize(&caller, request.method(), request.uri().path())?;
    request.extensions_mut().insert(caller);
    Ok(next.run(request).await)
}

/// The caller a stored token names, if its secret matches.
async fn stored_caller(state: &AdminState, given: &str) -> Result<Caller, ApiError> {
    let Some((id, secret)) = given[TOKEN_PREFIX.len()..].split_once('_') else {
        return Err(ApiError::Unauthorized);
    };
    let Some(token) = state.store.get_token(id).await? else {
        return Err(ApiError::Unauthorized);
    };
    let digest = secret_digest(secret);
    if !constant_time_eq(digest.as_bytes(), token.secret_sha256.as_bytes()) {
        return Err(ApiError::Unauthorized);
    }
    let scope = TokenScope::parse(&token.scope).map_err(|_| ApiError::Unauthorized)?;
    Ok(Caller {
        id: token.id,
        scope: Some(scope),
    })
}

/// Whether `caller` may make this call; 403 naming its scope when not.
fn authorize(caller: &Caller, method: &Method, path: &str) -> Result<(), ApiError> {
    let Some(scope) = &caller.scope else {
        return Ok(());
    };
    let refused = |message: String| {
        Err(ApiError::Forbidden {
            message,
            field: "authorization",
        })
    };
    if path == "/v1/tokens" || path.starts_with("/v1/tokens/") {
        return refused(format!(
            "token {} ({scope}) cannot manage tokens: only the router's --admin-token can",
            caller.id
        ));
    }
    let reads = method == Method::GET || method == Method::HEAD;
    match scope {
        TokenScope::Write => Ok(()),
        TokenScope::Read if reads => Ok(()),
        TokenScope::Read => refused(format!(
            "token {} has the read scope: it cannot write",
            caller.id
        )),
        TokenScope::Apps(prefix) => match app_in_path(path) {
            Some(app) if scope.may_write_app(app) => Ok(()),
            _ => refused(format!(
                "token {} has the scope apps:{prefix}: it reaches only /v1/apps/NAME for apps \
                 whose names start with {prefix}",
                caller.id
            )),
        },
    }
}

/// The app a path under `/v1/apps/NAME` names.
pub(crate) fn app_in_path(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/apps/")?;
    let name = rest.split('/').next().unwrap_or(rest);
    (!name.is_empty()).then_some(name)
}

/// Hex SHA-256 of a token's secret part: secrets are 256 random bits, so a fast digest is
/// as safe as a slow one and costs nothing per call.
pub(crate) fn secret_digest(secret: &str) -> String {
    openssl::sha::sha256(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Compares without an early exit, so response timing does not reveal a token's prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(scope: &str) -> Caller {
        Caller {
            id: "t1".into(),
            scope: Some(TokenScope::parse(scope).expect("scope")),
        }
    }

    #[test]
    fn scopes_decide_which_calls_pass() {
        let allowed = |scope: &str, method: Method, path: &str| {
            authorize(&caller(scope), &method, path).is_ok()
        };
        assert!(allowed("read", Method::GET, "/v1/apps"));
        assert!(!allowed("read", Method::PUT, "/v1/apps/web"));
        assert!(!allowed("read", Method::GET, "/v1/tokens"));
        assert!(allowed("write", Method::DELETE, "/v1/certs/a.com"));
        assert!(!allowed("write", Method::POST, "/v1/tokens"));
        assert!(!allowed("write", Method::DELETE, "/v1/tokens/abc"));
        assert!(allowed("apps:acme-", Method::PUT, "/v1/apps/acme-web"));
        assert!(allowed(
            "apps:acme-",
            Method::PUT,
            "/v1/apps/acme-web/backends"
        ));
        assert!(allowed("apps:acme-", Method::GET, "/v1/apps/acme-web"));
        assert!(!allowed("apps:acme-", Method::PUT, "/v1/apps/other"));
        assert!(!allowed("apps:acme-", Method::GET, "/v1/apps"));
        assert!(!allowed("apps:acme-", Method::POST, "/v1/import/apps"));
        assert!(!allowed("apps:acme-", Method::GET, "/v1/certs"));
        let admin = Caller {
            id: BOOTSTRAP_ID.into(),
            scope: None,
        };
        assert!(authorize(&admin, &Method::POST, "/v1/tokens").is_ok());
    }

    #[test]
    fn digests_are_hex_sha256() {
        assert_eq!(
            secret_digest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
