//! Stage basic_auth: password protection of an app (review apps, staging) by HTTP Basic
//! authentication (RFC 7617) against bcrypt hashes in htpasswd's format.
//!
//! bcrypt is slow on purpose (2^cost rounds: milliseconds to a quarter second), so a check
//! never runs on an event loop: it goes to the worker pool, within a deadline. Credentials
//! that passed are remembered for a while by a SHA-256 of the app, the user, the stored hash
//! and the password — never the password itself — so a browser's every request does not
//! cost a bcrypt; a changed hash is a different key. Failed attempts are counted per app
//! and client: past [`MAX_FAILURES`] in [`FAILURE_WINDOW`] the client is answered 429 until
//! the window ends, without a check.

use std::net::IpAddr;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use crate::context::RequestCtx;
use crate::isolation::worker_pool::WorkerPool;
use crate::metrics;
use crate::request_fields::Fields;

/// How long credentials that passed are taken without a new check.
const REMEMBERED_FOR: Duration = Duration::from_secs(600);
/// Credentials remembered at most, over all apps.
const REMEMBERED: usize = 4096;
/// Failed attempts a client may make on one app within [`FAILURE_WINDOW`].
pub(crate) const MAX_FAILURES: u32 = 10;
pub(crate) const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Clients whose failures are counted at most; past it the least recent is forgotten.
const FAILING_CLIENTS: usize = 65_536;
/// Longest a check may wait for and take on the worker pool.
const CHECK_DEADLINE: Duration = Duration::from_secs(2);

static PASSED: LazyLock<quick_cache::sync::Cache<[u8; 32], Instant>> =
    LazyLock::new(|| quick_cache::sync::Cache::new(REMEMBERED));

/// An app and a client.
type FailingClient = (Arc<str>, IpAddr);

/// Failures counted, and since when, by app and client.
static FAILURES: LazyLock<quick_cache::sync::Cache<FailingClient, (u32, Instant)>> =
    LazyLock::new(|| quick_cache::sync::Cache::new(FAILING_CLIENTS));

/// Why a request to a protected app is not let through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Denied {
    /// 401 with `WWW-Authenticate` for this realm.
    Unauthorized(String),
    /// 429: too many failures from this client; come back in so many seconds.
    LockedOut(u32),
    /// 503: the worker pool could not check the password in time.
    Overloaded,
}

/// Lets the request through when the app has no password, the path is open, or its
/// credentials are those of one of the app's users.
pub(crate) async fn check(
    ctx: &RequestCtx,
    path: &str,
    fields: Fields<'_>,
    client: IpAddr,
    pool: Option<&WorkerPool>,
) -> Result<(), Denied> {
    let Some(route) = ctx.route.as_ref() else {
        return Ok(());
    };
    let Some(auth) = route.app.basic_auth.as_deref() else {
        return Ok(());
    };
    if auth.is_open(path) {
        count("open");
        return Ok(());
    }
    let app = route.app.name.as_str();
    let failures_key = (Arc::<str>::from(app), client);
    if let Some(wait) = locked_out_for(&failures_key) {
        count("locked_out");
        return Err(Denied::LockedOut(wait));
    }
    let unauthorized = || Denied::Unauthorized(auth.realm.clone());
    let Some((user, password)) = credentials(fields) else {
        // No credentials is a browser's first request, not an attempt: not counted.
        count("refused");
        return Err(unauthorized());
    };
    let Some(hash) = auth.users.get(&user) else {
        return Err(failed(failures_key, unauthorized()));
    };
    let key = remembered_key(app, &user, hash, &password);
    if PASSED
        .get(&key)
        .is_some_and(|at| at.elapsed() < REMEMBERED_FOR)
    {
        count("cached");
        return Ok(());
    }
    let hash = hash.clone();
    let verify = move || bcrypt::verify(password.as_bytes(), &hash).unwrap_or(false);
    let verified = match pool {
        Some(pool) => pool
            .run("basic_auth", Instant::now() + CHECK_DEADLINE, verify)
            .await
            .map_err(|_| {
                count("overloaded");
                Denied::Overloaded
            })?,
        None => verify(),
    };
    if !verified {
        return Err(failed(failures_key, unauthorized()));
    }
    count("verified");
    PASSED.insert(key, Instant::now());
    Ok(())
}

/// The user and password of a `Basic` Authorization (RFC 7617: the scheme in any case, the
/// user before the first ':'); `None` when there is none or it cannot be read.
fn credentials(fields: Fields<'_>) -> Option<(String, String)> {
    let value = std::str::from_utf8(fields.values("authorization").next()?).ok()?;
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = openssl::base64::decode_block(encoded.trim()).ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

fn remembered_key(app: &str, user: &str, hash: &str, password: &str) -> [u8; 32] {
    let mut hasher = openssl::sha::Sha256::new();
    for part in [app, user, hash, password] {
        hasher.update(&(part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    hasher.finish()
}

/// Seconds left of the client's lockout on the app, if it is locked out.
fn locked_out_for(key: &FailingClient) -> Option<u32> {
    let (count, since) = FAILURES.get(key)?;
    let elapsed = since.elapsed();
    if count < MAX_FAILURES || elapsed >= FAILURE_WINDOW {
        return None;
    }
    Some((FAILURE_WINDOW - elapsed).as_secs().max(1) as u32)
}

/// Counts a failed attempt of the client on the app.
fn failed(key: FailingClient, denied: Denied) -> Denied {
    count("refused");
    let now = Instant::now();
    let counted = match FAILURES.get(&key) {
        Some((count, since)) if since.elapsed() < FAILURE_WINDOW => (count + 1, since),
        _ => (1, now),
    };
    FAILURES.insert(key, counted);
    metrics::BASIC_AUTH_FAILING_CLIENTS.set(FAILURES.len() as i64);
    denied
}

/// The `WWW-Authenticate` challenge of a realm (RFC 7617 §2, with its UTF-8 charset).
pub(crate) fn challenge(realm: &str) -> String {
    format!("Basic realm=\"{realm}\", charset=\"UTF-8\"")
}

/// Counts a request's result in `switchyard_basic_auth_checks_total`.
fn count(result: &str) {
    metrics::count_result(
        &metrics::BASIC_AUTH_BY_RESULT,
        &metrics::BASIC_AUTH_RESULTS,
        &metrics::BASIC_AUTH_CHECKS,
        result,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::AUTHORIZATION;
    use http::{HeaderMap, HeaderValue};

    #[test]
    fn basic_credentials_are_read_in_any_case_of_the_scheme() {
        let mut headers = HeaderMap::new();
        // "alice:pa:ss" — a password may hold ':'.
        headers.insert(
            AUTHORIZATION,
            HeaderValue::from_static("bAsIc YWxpY2U6cGE6c3M="),
        );
        assert_eq!(
            credentials(Fields::Map(&headers)),
            Some(("alice".to_string(), "pa:ss".to_string()))
        );
        headers.insert(
            AUTHORIZATION,
            HeaderValue::from_static("Bearer YWxpY2U6cGE6c3M="),
        );
        assert_eq!(credentials(Fields::Map(&headers)), None);
        headers.insert(AUTHORIZATION, HeaderValue::from_static("Basic !!!"));
        assert_eq!(credentials(Fields::Map(&headers)), None);
    }

    #[test]
    fn a_client_is_locked_out_after_its_failures_for_the_window_only() {
        let key = (
            Arc::<str>::from("locked-out-test"),
            "192.0.2.9".parse().expect("ip"),
        );
        for _ in 0..MAX_FAILURES {
            assert_eq!(locked_out_for(&key), None);
            failed(key.clone(), Denied::Overloaded);
        }
        let wait = locked_out_for(&key).expect("locked out");
        assert!((1..=60).contains(&wait), "{wait}");
        FAILURES.insert(key.clone(), (MAX_FAILURES, Instant::now() - FAILURE_WINDOW));
        assert_eq!(locked_out_for(&key), None, "the window ended");
    }

    #[test]
    fn remembered_keys_change_with_the_hash_and_do_not_run_together() {
        let key = remembered_key("app", "alice", "$2y$05$h", "pw");
        assert_ne!(key, remembered_key("app", "alice", "$2y$05$g", "pw"));
        assert_ne!(
            remembered_key("ab", "c", "h", "p"),
            remembered_key("a", "bc", "h", "p")
        );
    }
}
