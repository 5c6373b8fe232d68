//! Stage basic_auth: password protection of an app (review apps, staging) by HTTP Basic
//! authentication (RFC 7617) against bcrypt hashes in htpasswd's format.
//!
//! bcrypt is slow on purpose (2^cost rounds: milliseconds to a quarter second), so a check
//! never runs on an event loop: it goes to the worker pool, within a deadline. Credentials
//! that passed are remembered for a while by a SHA-256 of the app, the user, the stored hash
//! and the password — never the password itself — so a browser's every request does not
//! cost a bcrypt; a changed hash is a different key. Requests that bring the same
//! credentials while they are being checked (a browser's page of assets right after its
//! password prompt) wait for that one check rather than each running its own. A
//! connection notes the credentials that last passed on it (the field as sent, for the
//! app's route as it was): its next requests bring the same field, and go through on a
//! comparison rather than a decoding and a SHA-256 each. Failed attempts are counted per
//! app and client: past [`MAX_FAILURES`] in [`FAILURE_WINDOW`] the client is answered 429
//! until the window ends, without a check.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::context::RequestCtx;
use crate::isolation::worker_pool::WorkerPool;
use crate::metrics;
use crate::request_fields::Fields;
use crate::routing::route_cache::AppRoute;

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

/// A check under way, its outcome shared by every request with the same credentials.
type Check = Arc<tokio::sync::OnceCell<bool>>;

/// Checks under way by remembered key, at most [`REMEMBERED`] (past it, a check runs
/// alone); each leaves when the request that began it ends
/// (`switchyard_basic_auth_checks_under_way`).
static CHECKING: LazyLock<Mutex<HashMap<[u8; 32], Check>>> = LazyLock::new(Mutex::default);

/// The credentials that last passed on one client connection, for a route.
#[derive(Default)]
pub(crate) struct PassedOnConnection(RefCell<Option<Passed>>);

struct Passed {
    /// The route they passed for: held, so that a changed app (another route) is never
    /// taken for the one they passed.
    route: Arc<AppRoute>,
    /// The Authorization field as sent on this connection, compared in constant time (a
    /// connection a CDN shares between its users must not tell one user's by timing).
    field: Box<[u8]>,
    at: Instant,
}

impl PassedOnConnection {
    fn holds(&self, route: &Arc<AppRoute>, field: &[u8], now: Instant) -> bool {
        self.0.borrow().as_ref().is_some_and(|passed| {
            same_in_constant_time(&passed.field, field)
                && Arc::ptr_eq(&passed.route, route)
                && now.saturating_duration_since(passed.at) < REMEMBERED_FOR
        })
    }

    fn note(&self, route: &Arc<AppRoute>, field: &[u8], at: Instant) {
        *self.0.borrow_mut() = Some(Passed {
            route: route.clone(),
            field: field.into(),
            at,
        });
    }
}

/// Whether `a` and `b` are the same bytes, in a time that depends on their length only: no
/// early exit at the first difference (a fold of their XORs, which compiles to vector
/// instructions; OpenSSL's byte-at-a-time `CRYPTO_memcmp` cost ten times as much).
fn same_in_constant_time(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0, |differ, (x, y)| differ | (x ^ y)) == 0
}

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

/// Credentials a request brought that no check remembers: checked by bcrypt ([`check`]).
pub(crate) struct Unchecked {
    route: Arc<AppRoute>,
    client: IpAddr,
    key: [u8; 32],
    hash: String,
    password: String,
    /// The Authorization field, noted on the connection once it passed.
    field: Box<[u8]>,
    at: Instant,
}

/// What can be said of a request at once, without a check: through (`None`: the app has
/// no password, the path is open, or its credentials passed on this connection or within
/// [`REMEMBERED_FOR`]), denied, or credentials to [`check`]. Not async, so a request whose
/// credentials are remembered pays for no future.
pub(crate) fn screen(
    ctx: &RequestCtx,
    path: &str,
    fields: Fields<'_>,
    (client, on_connection): (IpAddr, &PassedOnConnection),
) -> Result<Option<Box<Unchecked>>, Denied> {
    let Some(route) = ctx.route.as_ref() else {
        return Ok(None);
    };
    let Some(auth) = route.app.basic_auth.as_deref() else {
        return Ok(None);
    };
    if auth.is_open(path) {
        count("open");
        return Ok(None);
    }
    let app = route.app.name.as_str();
    // Made only when a client failed somewhere (most of the time none has): an allocation.
    let failing = || (Arc::<str>::from(app), client);
    if let Some(wait) = (!FAILURES.is_empty())
        .then(|| locked_out_for(&failing()))
        .flatten()
    {
        count("locked_out");
        return Err(Denied::LockedOut(wait));
    }
    let unauthorized = || Denied::Unauthorized(auth.realm.clone());
    let now = Instant::now();
    let field = fields.first("authorization").unwrap_or_default();
    if !field.is_empty() && on_connection.holds(route, field, now) {
        count("cached");
        return Ok(None);
    }
    let Some((user, password)) = credentials(fields) else {
        // No credentials is a browser's first request, not an attempt: not counted.
        count("refused");
        return Err(unauthorized());
    };
    let Some(hash) = auth.users.get(&user) else {
        return Err(failed(failing(), unauthorized()));
    };
    let key = remembered_key(app, &user, hash, &password);
    if PASSED
        .get(&key)
        .is_some_and(|at| now.saturating_duration_since(at) < REMEMBERED_FOR)
    {
        count("cached");
        on_connection.note(route, field, now);
        return Ok(None);
    }
    Ok(Some(Box::new(Unchecked {
        route: route.clone(),
        client,
        key,
        hash: hash.clone(),
        password,
        field: field.into(),
        at: now,
    })))
}

/// Checks credentials by bcrypt on the worker pool, within a deadline, or shares the check
/// of the same credentials another request began.
pub(crate) async fn check(
    unchecked: Box<Unchecked>,
    on_connection: &PassedOnConnection,
    pool: Option<&WorkerPool>,
) -> Result<(), Denied> {
    let Unchecked {
        route,
        client,
        key,
        hash,
        password,
        field,
        at,
    } = *unchecked;
    let under_way = CheckUnderWay::join(key);
    let mut ran = false;
    let outcome = under_way.check.get_or_try_init(|| {
        ran = true;
        let verify = move || bcrypt::verify(password.as_bytes(), &hash).unwrap_or(false);
        async move {
            let verified = match pool {
                Some(pool) => pool
                    .run("basic_auth", Instant::now() + CHECK_DEADLINE, verify)
                    .await
                    .map_err(|_| Denied::Overloaded)?,
                None => verify(),
            };
            if verified {
                PASSED.insert(key, Instant::now());
            }
            Ok(verified)
        }
    });
    let verified = match outcome.await {
        Ok(verified) => *verified,
        Err(denied) => {
            count("overloaded");
            return Err(denied);
        }
    };
    if !verified {
        let realm = (route.app.basic_auth.as_deref()).map_or_else(String::new, |a| a.realm.clone());
        let failing = (Arc::<str>::from(route.app.name.as_str()), client);
        return Err(failed(failing, Denied::Unauthorized(realm)));
    }
    count(if ran { "verified" } else { "shared" });
    on_connection.note(&route, &field, at);
    Ok(())
}

/// A request's part in the check of its credentials: the check under way it joined, or
/// the one it began (and takes out of [`CHECKING`] when it ends, however it ends; requests
/// that joined keep their share of it).
struct CheckUnderWay {
    key: [u8; 32],
    check: Check,
    began: bool,
}

impl CheckUnderWay {
    fn join(key: [u8; 32]) -> Self {
        let mut checking = CHECKING.lock();
        if let Some(check) = checking.get(&key) {
            return Self {
                key,
                check: check.clone(),
                began: false,
            };
        }
        let check = Check::default();
        let began = checking.len() < REMEMBERED;
        if began {
            checking.insert(key, check.clone());
            metrics::BASIC_AUTH_CHECKS_UNDER_WAY.set(checking.len() as i64);
        }
        Self { key, check, began }
    }
}

impl Drop for CheckUnderWay {
    fn drop(&mut self) {
        if !self.began {
            return;
        }
        let mut checking = CHECKING.lock();
        if checking
            .get(&self.key)
            .is_some_and(|check| Arc::ptr_eq(check, &self.check))
        {
            checking.remove(&self.key);
            metrics::BASIC_AUTH_CHECKS_UNDER_WAY.set(checking.len() as i64);
        }
    }
}

/// The user and password of a `Basic` Authorization (RFC 7617: the scheme in any case, the
/// user before the first ':'); `None` when there is none or it cannot be read.
fn credentials(fields: Fields<'_>) -> Option<(String, String)> {
    let value = std::str::from_utf8(fields.first("authorization")?).ok()?;
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
    fn fields_are_the_same_only_when_every_byte_is() {
        assert!(same_in_constant_time(
            b"Basic YWxpY2U6cHc=",
            b"Basic YWxpY2U6cHc="
        ));
        assert!(!same_in_constant_time(
            b"Basic YWxpY2U6cHc=",
            b"Basic YWxpY2U6cHd="
        ));
        assert!(!same_in_constant_time(
            b"Basic YWxpY2U6cHc=",
            b"Basic YWxpY2U6cHc"
        ));
        assert!(!same_in_constant_time(b"a", b""));
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
