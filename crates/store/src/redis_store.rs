//! The fleet store: apps, the domain index and certificates in one Redis shared by many
//! routers. Every write is one Lua script — the records, a revision counter and
//! the Pub/Sub event change together or not at all — so no router ever reads half a change.
//! The key layout is a contract (docs/fleet.md, "Redis layout"): platform tooling may write it
//! directly and publish the same event.
//!
//! Redis being away must never take routes down: callers (the route and certificate caches)
//! keep what they have; here every call is bounded by a deadline and fails fast, and the
//! connection is re-established lazily, at most once per back-off step.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};
use switchyard_model::{
    ApiToken, App, AuditPage, AuditQuery, AuditRecord, Backend, CertificateInfo, Change,
    FilterModule, IfMatch, StoredCertificate,
};

use crate::json::{decode, encode};
use crate::metrics;
use crate::redis_link::{RedisLink, RedisTimeouts};
use crate::AppWrite;
use crate::{expiry_key, require_match, unix_now};
use crate::{
    AcmeRecord, AppPage, CertPage, ChangeFeed, Store, StoreError, StoreStatus, Subscription,
};

/// Prefix of every key; see docs/fleet.md, "Redis layout".
pub const KEY_PREFIX: &str = "switchyard:";
/// The Pub/Sub channel every change is announced on.
pub const CHANGES_CHANNEL: &str = "switchyard:changes";
const REVISION_KEY: &str = "switchyard:revision";

const PUBSUB_BACKOFF_MIN: Duration = Duration::from_millis(100);
const PUBSUB_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Optimistic retries of a read-modify-write (scale) racing other writers.
const CAS_ATTEMPTS: usize = 8;
/// Certificates read per call while adding those stored before the expiry index to it.
const EXPIRY_INDEX_PAGE: usize = 500;

// The scripts encode their events as tables for cjson, the fields of `ChangeEvent` (which
// decodes them, and encodes the events published from Rust): never by concatenating text.
// cjson cannot write an empty array (it writes `{}`), so an empty list is left out, as
// serde leaves it out.

/// Writes an app: refuses domains owned by another app, moves the domain index, bumps the
/// revision and publishes the event. ARGV: name, app JSON, expected previous JSON or "" for
/// "any", then the domains. Returns {"ok", event} | {"taken", domain, owner} | {"conflict"}.
const PUT_APP: &str = r#"
local p = '{KEY_PREFIX}'
local name, json, expected = ARGV[1], ARGV[2], ARGV[3]
local prev = redis.call('GET', p .. 'app:' .. name)
if expected ~= '' and prev ~= expected then return {'conflict'} end
local wanted = {}
for i = 4, #ARGV do
  local owner = redis.call('GET', p .. 'domain:' .. ARGV[i])
  if owner and owner ~= name then return {'taken', ARGV[i], owner} end
  wanted[ARGV[i]] = true
end
local touched, seen = {}, {}
if prev then
  for _, d in ipairs(cjson.decode(prev).domains or {}) do
    if not wanted[d] then redis.call('DEL', p .. 'domain:' .. d) end
    table.insert(touched, d); seen[d] = true
  end
end
for i = 4, #ARGV do
  redis.call('SET', p .. 'domain:' .. ARGV[i], name)
  if not seen[ARGV[i]] then table.insert(touched, ARGV[i]) end
end
redis.call('SET', p .. 'app:' .. name, json)
redis.call('ZADD', p .. 'apps', 0, name)
local rev = redis.call('INCR', p .. 'revision')
local event = {kind = 'app', name = name, rev = rev}
if #touched > 0 then event.domains = touched end
event = cjson.encode(event)
redis.call('PUBLISH', p .. 'changes', event)
return {'ok', event}
"#;

/// Deletes an app and its domain index entries. ARGV: name. Returns the event, or nil when
/// the app was absent.
const DELETE_APP: &str = r#"
local p = '{KEY_PREFIX}'
local name, expected = ARGV[1], ARGV[2] or ''
local prev = redis.call('GET', p .. 'app:' .. name)
if expected ~= '' and prev ~= expected then return 'conflict' end
if not prev then return false end
local touched = {}
for _, d in ipairs(cjson.decode(prev).domains or {}) do
  redis.call('DEL', p .. 'domain:' .. d)
  table.insert(touched, d)
end
redis.call('DEL', p .. 'app:' .. name)
redis.call('ZREM', p .. 'apps', name)
local rev = redis.call('INCR', p .. 'revision')
local event = {kind = 'app', name = name, rev = rev}
if #touched > 0 then event.domains = touched end
event = cjson.encode(event)
redis.call('PUBLISH', p .. 'changes', event)
return event
"#;

/// Applies a batch of app writes whole or not at all. ARGV[1]: a JSON array of
/// `{"name", "json" (absent for a delete), "expected" (the previous JSON, or "" for none),
/// "domains"}`. Every write is checked first — its app still as expected, its domains free
/// or freed by an earlier write of the batch — and only then are all made, each bumping the
/// revision and publishing its event as PUT_APP and DELETE_APP do. Returns
/// {"ok", event…} | {"conflict", name} | {"taken", domain, owner}.
const APPLY_APPS: &str = r#"
local p = '{KEY_PREFIX}'
local ops = cjson.decode(ARGV[1])
local app_now, owner_now = {}, {}
local function app_of(name)
  if app_now[name] == nil then app_now[name] = redis.call('GET', p .. 'app:' .. name) or false end
  return app_now[name]
end
local function owner_of(domain)
  if owner_now[domain] == nil then owner_now[domain] = redis.call('GET', p .. 'domain:' .. domain) or false end
  return owner_now[domain]
end
for _, op in ipairs(ops) do
  local prev = app_of(op.name)
  if (op.expected == '' and prev) or (op.expected ~= '' and prev ~= op.expected) then
    return {'conflict', op.name}
  end
  if prev then
    for _, d in ipairs(cjson.decode(prev).domains or {}) do
      if owner_of(d) == op.name then owner_now[d] = false end
    end
  end
  if op.json then
    for _, d in ipairs(op.domains or {}) do
      local owner = owner_of(d)
      if owner and owner ~= op.name then return {'taken', d, owner} end
      owner_now[d] = op.name
    end
    app_now[op.name] = op.json
  else
    app_now[op.name] = false
  end
end
local events = {'ok'}
for _, op in ipairs(ops) do
  local prev = redis.call('GET', p .. 'app:' .. op.name)
  local touched, seen, wanted = {}, {}, {}
  for _, d in ipairs(op.domains or {}) do wanted[d] = true end
  if prev then
    for _, d in ipairs(cjson.decode(prev).domains or {}) do
      if not wanted[d] and redis.call('GET', p .. 'domain:' .. d) == op.name then
        redis.call('DEL', p .. 'domain:' .. d)
      end
      table.insert(touched, d); seen[d] = true
    end
  end
  if op.json then
    for _, d in ipairs(op.domains or {}) do
      redis.call('SET', p .. 'domain:' .. d, op.name)
      if not seen[d] then table.insert(touched, d) end
    end
    redis.call('SET', p .. 'app:' .. op.name, op.json)
    redis.call('ZADD', p .. 'apps', 0, op.name)
  else
    redis.call('DEL', p .. 'app:' .. op.name)
    redis.call('ZREM', p .. 'apps', op.name)
  end
  local rev = redis.call('INCR', p .. 'revision')
  local event = {kind = 'app', name = op.name, rev = rev}
  if #touched > 0 then event.domains = touched end
  event = cjson.encode(event)
  redis.call('PUBLISH', p .. 'changes', event)
  table.insert(events, event)
end
return events
"#;

/// Stores or (with empty JSON) deletes a certificate. ARGV: domain, full JSON, info JSON,
/// its key in the expiry index (`certs:expiry`, whose members sort by expiry; the member of
/// each domain is kept under `certexpiry:` so a replacement or a deletion can remove it).
/// With ARGV[5], the description expected stored now (else -1, nothing written). Returns 1
/// when something was written or removed.
const WRITE_CERT: &str = r#"
local p = '{KEY_PREFIX}'
local domain, full, info, expiry, expected = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5] or ''
if expected ~= '' and redis.call('GET', p .. 'certinfo:' .. domain) ~= expected then return -1 end
local old_expiry = redis.call('GET', p .. 'certexpiry:' .. domain)
if full == '' then
  if redis.call('DEL', p .. 'cert:' .. domain) == 0 then return 0 end
  redis.call('DEL', p .. 'certinfo:' .. domain, p .. 'certexpiry:' .. domain)
  redis.call('ZREM', p .. 'certs', domain)
else
  redis.call('SET', p .. 'cert:' .. domain, full)
  redis.call('SET', p .. 'certinfo:' .. domain, info)
  redis.call('ZADD', p .. 'certs', 0, domain)
  redis.call('SET', p .. 'certexpiry:' .. domain, expiry)
  redis.call('ZADD', p .. 'certs:expiry', 0, expiry)
end
if old_expiry and old_expiry ~= expiry then
  redis.call('ZREM', p .. 'certs:expiry', old_expiry)
end
local rev = redis.call('INCR', p .. 'revision')
redis.call('PUBLISH', p .. 'changes', cjson.encode({kind = 'cert', domain = domain, rev = rev}))
return 1
"#;

/// Adds certificates stored before the expiry index existed to it. ARGV: pairs of domain
/// and expiry key. A domain indexed meanwhile (by a write) or deleted is left alone.
const INDEX_CERT_EXPIRY: &str = r#"
local p = '{KEY_PREFIX}'
local added = 0
for i = 1, #ARGV, 2 do
  local domain, expiry = ARGV[i], ARGV[i + 1]
  if redis.call('EXISTS', p .. 'certinfo:' .. domain) == 1
      and redis.call('EXISTS', p .. 'certexpiry:' .. domain) == 0 then
    redis.call('SET', p .. 'certexpiry:' .. domain, expiry)
    redis.call('ZADD', p .. 'certs:expiry', 0, expiry)
    added = added + 1
  end
end
return added
"#;

/// Takes or extends the ACME issuing lease. ARGV: holder, TTL in ms. The value is
/// "TOKEN HOLDER"; a new holder gets a new token from the fence counter. Returns the token
/// while ARGV[1] holds the lease, nil while another does.
const ACME_LEASE: &str = r#"
local p = '{KEY_PREFIX}'
local current = redis.call('GET', p .. 'acme:lease')
if current then
  local token, holder = string.match(current, '^(%d+) (.*)$')
  if holder ~= ARGV[1] then return false end
  redis.call('PEXPIRE', p .. 'acme:lease', ARGV[2])
  return tonumber(token)
end
local token = redis.call('INCR', p .. 'acme:fence')
redis.call('SET', p .. 'acme:lease', token .. ' ' .. ARGV[1], 'PX', ARGV[2])
return token
"#;

/// Gives the ACME lease up if ARGV[1] holds it.
const ACME_RELEASE: &str = r#"
local p = '{KEY_PREFIX}'
local current = redis.call('GET', p .. 'acme:lease')
if current and string.match(current, '^%d+ (.*)$') == ARGV[1] then
  redis.call('DEL', p .. 'acme:lease')
end
return 1
"#;

/// The Redis-backed store.
#[derive(Clone)]
pub struct RedisStore {
    link: Arc<RedisLink>,
    changes: Arc<ChangeFeed>,
    healthy: Arc<AtomicBool>,
    unreachable_reported: Arc<AtomicBool>,
    put_app: Arc<Script>,
    delete_app: Arc<Script>,
    apply_apps: Arc<Script>,
    write_cert: Arc<Script>,
    index_cert_expiry: Arc<Script>,
    /// Whether this process checked that every certificate is in the expiry index.
    expiry_index_checked: Arc<AtomicBool>,
    acme_lease: Arc<Script>,
    acme_release: Arc<Script>,
    /// Where the change subscription stands, for the status.
    following: Arc<parking_lot::Mutex<Following>>,
    /// How many replicas must hold an app or certificate write before it is answered.
    acks: WriteAcks,
}

/// How many replicas must hold a write of an app or a certificate before the store answers
/// it (Redis `WAIT`): a write only the primary holds is lost if the primary dies and
/// Sentinel promotes a replica that had not received it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteAcks {
    /// `None`: one when the primary has a replica, none when it has none.
    pub replicas: Option<u32>,
    /// How long a write waits for them.
    pub timeout: Duration,
}

impl Default for WriteAcks {
    fn default() -> Self {
        Self {
            replicas: None,
            timeout: Duration::from_millis(1000),
        }
    }
}

/// A compare-and-set that lost to other writes every time it tried.
fn kept_changing(what: &str) -> StoreError {
    StoreError::Unavailable(format!(
        "{what} kept changing under {CAS_ATTEMPTS} attempts to write it"
    ))
}

/// The change subscription's state.
#[derive(Debug, Default)]
struct Following {
    subscribed: bool,
    last_revision: Option<i64>,
    last_sync_unix: Option<i64>,
}

impl RedisStore {
    /// A store on `url` (`redis://[:password@]host:port/db`, or `rediss://` for TLS). Nothing
    /// is connected yet: a router starts even while Redis is away.
    pub fn new(url: &str, timeouts: RedisTimeouts) -> Result<Self, StoreError> {
        let link =
            RedisLink::new(url, "route store", timeouts, 1).map_err(StoreError::Unavailable)?;
        metrics::register_all();
        // Known from now on, on this router only: its routes are in Redis, not reached yet.
        metrics::STORE_AVAILABLE.set(0.0);
        Ok(Self {
            link: Arc::new(link),
            changes: Arc::default(),
            healthy: Arc::new(AtomicBool::new(false)),
            unreachable_reported: Arc::new(AtomicBool::new(false)),
            put_app: Arc::new(script(PUT_APP)),
            delete_app: Arc::new(script(DELETE_APP)),
            apply_apps: Arc::new(script(APPLY_APPS)),
            write_cert: Arc::new(script(WRITE_CERT)),
            index_cert_expiry: Arc::new(script(INDEX_CERT_EXPIRY)),
            expiry_index_checked: Arc::new(AtomicBool::new(false)),
            acme_lease: Arc::new(script(ACME_LEASE)),
            acme_release: Arc::new(script(ACME_RELEASE)),
            following: Arc::default(),
            acks: WriteAcks::default(),
        })
    }

    /// Answers app and certificate writes only once `acks` holds.
    pub fn with_write_acks(mut self, acks: WriteAcks) -> Self {
        self.acks = acks;
        self
    }

    /// Waits until the replicas the policy asks for hold every write this link made so far
    /// (`WAIT` covers all earlier writes of the connection, and the link has one).
    /// `StoreError::NotDurable` when they do not within the timeout: the write is on the
    /// primary, not yet safe from a failover.
    async fn make_durable(&self) -> Result<(), StoreError> {
        let wanted = match self.acks.replicas {
            Some(0) => return Ok(()),
            Some(wanted) => wanted,
            None if self.connected_replicas().await? == 0 => return Ok(()),
            None => 1,
        };
        let timeout_ms = u64::try_from(self.acks.timeout.as_millis()).unwrap_or(u64::MAX);
        let deadline = self.link.timeouts().operation + self.acks.timeout;
        let acked: i64 = self
            .call_within(deadline, |mut c| async move {
                redis::cmd("WAIT")
                    .arg(wanted)
                    .arg(timeout_ms)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        if acked >= i64::from(wanted) {
            return Ok(());
        }
        metrics::STORE_WRITES_NOT_DURABLE.inc();
        Err(StoreError::NotDurable(format!(
            "{acked} of the {wanted} replicas asked for (--store-ack-replicas) acknowledged \
             it within {timeout_ms} ms"
        )))
    }

    /// The replicas connected to the primary now (`INFO replication`).
    async fn connected_replicas(&self) -> Result<u32, StoreError> {
        let info: String = self
            .call(|mut c| async move {
                redis::cmd("INFO")
                    .arg("replication")
                    .query_async(&mut c)
                    .await
            })
            .await?;
        Ok(info
            .lines()
            .find_map(|line| line.strip_prefix("connected_slaves:"))
            .and_then(|count| count.trim().parse().ok())
            .unwrap_or(0))
    }

    /// Notes the subscription's state and the revision last seen.
    fn note_following(&self, subscribed: bool, revision: Option<i64>) {
        let mut following = self.following.lock();
        following.subscribed = subscribed;
        if subscribed {
            following.last_sync_unix = Some(unix_now() as i64);
            metrics::LAST_SYNC.set(unix_now() as i64);
        }
        if let Some(revision) = revision {
            following.last_revision = Some(revision);
            metrics::REVISION.set(revision);
        }
    }

    fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
        metrics::STORE_AVAILABLE.set(f64::from(u8::from(healthy)));
    }

    /// Runs one call against Redis within the operation deadline; failures are counted and
    /// mark the store unavailable until a call succeeds again.
    async fn call<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        self.call_within(self.link.timeouts().operation, op).await
    }

    /// [`RedisStore::call`] with a deadline of its own.
    async fn call_within<T, F, Fut>(&self, deadline: Duration, op: F) -> Result<T, StoreError>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        match self.link.call_within(deadline, op).await {
            Ok(value) => {
                self.set_healthy(true);
                Ok(value)
            }
            Err(e) => {
                if let Some(kind) = e.kind() {
                    metrics::STORE_ERRORS.with_label_values(&[kind]).inc();
                }
                if e.is_outage() {
                    self.set_healthy(false);
                }
                Err(StoreError::Unavailable(e.to_string()))
            }
        }
    }

    async fn get_string(&self, key: String) -> Result<Option<String>, StoreError> {
        self.call(|mut c| async move { c.get::<_, Option<String>>(key).await })
            .await
    }

    /// Names in a sorted-set index after `after`, at most `limit`, and whether more follow.
    async fn page_of(
        &self,
        index: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<String>, bool), StoreError> {
        let min = match after {
            Some(after) => format!("({after}"),
            None => "-".to_string(),
        };
        let index = format!("{KEY_PREFIX}{index}");
        let fetch = limit.saturating_add(1) as isize;
        let mut names: Vec<String> = self
            .call(|mut c| async move { c.zrangebylex_limit(index, min, "+", 0, fetch).await })
            .await?;
        let more = names.len() > limit;
        names.truncate(limit);
        Ok((names, more))
    }

    /// Puts certificates stored by a router older than the expiry index into it, once per
    /// process: when the index holds fewer members than the certificates, every certificate
    /// is read in pages and the missing ones added.
    async fn ensure_expiry_index(&self) -> Result<(), StoreError> {
        if self.expiry_index_checked.load(Ordering::Relaxed) {
            return Ok(());
        }
        let (certs, indexed) = (
            format!("{KEY_PREFIX}certs"),
            format!("{KEY_PREFIX}certs:expiry"),
        );
        let (stored, in_index): (u64, u64) = self
            .call(|mut c| async move {
                redis::pipe()
                    .zcard(certs)
                    .zcard(indexed)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        if stored != in_index {
            self.index_missing_expiries().await?;
        }
        self.expiry_index_checked.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Reads every certificate, a page at a time, and adds to the expiry index those it lacks.
    async fn index_missing_expiries(&self) -> Result<(), StoreError> {
        let mut after: Option<String> = None;
        loop {
            let (domains, more) = self
                .page_of("certs", after.as_deref(), EXPIRY_INDEX_PAGE)
                .await?;
            let mut invocation = self.index_cert_expiry.prepare_invoke();
            for info in self.cert_infos(&domains).await? {
                invocation
                    .arg(&info.domain)
                    .arg(expiry_key(info.not_after, &info.domain));
            }
            let added: i64 = self
                .call(|mut c| async move { invocation.invoke_async(&mut c).await })
                .await?;
            if added > 0 {
                log::info!("indexed {added} certificates stored before the expiry index");
            }
            if !more {
                return Ok(());
            }
            after = domains.last().cloned();
        }
    }

    /// The stored descriptions of `domains`, in their order; a domain deleted since it was
    /// listed is left out.
    async fn cert_infos(
        &self,
        domains: &[impl AsRef<str>],
    ) -> Result<Vec<CertificateInfo>, StoreError> {
        let keys = domains
            .iter()
            .map(|d| format!("{KEY_PREFIX}certinfo:{}", d.as_ref()))
            .collect();
        let mut certs = Vec::with_capacity(domains.len());
        for (domain, json) in domains.iter().zip(self.get_many(keys).await?) {
            if let Some(json) = json {
                certs.push(decode::<CertificateInfo>(domain.as_ref(), &json)?);
            }
        }
        Ok(certs)
    }

    async fn get_many(&self, keys: Vec<String>) -> Result<Vec<Option<String>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.call(|mut c| async move {
            redis::cmd("MGET")
                .arg(keys)
                .query_async::<Vec<Option<String>>>(&mut c)
                .await
        })
        .await
    }

    async fn write_app(&self, app: &App, expected: Option<&str>) -> Result<PutOutcome, StoreError> {
        let json = encode(app.name.as_str(), app)?;
        let mut invocation = self.put_app.prepare_invoke();
        invocation
            .arg(app.name.as_str())
            .arg(json)
            .arg(expected.unwrap_or(""));
        for domain in &app.domains {
            invocation.arg(domain.as_str());
        }
        let reply: Vec<String> = self
            .call(|mut c| async move { invocation.invoke_async(&mut c).await })
            .await?;
        match reply.first().map(String::as_str) {
            Some("ok") => {
                self.announce_own(reply.get(1).map(String::as_str));
                self.make_durable().await?;
                Ok(PutOutcome::Done)
            }
            Some("taken") if reply.len() == 3 => Err(StoreError::DomainTaken {
                domain: reply[1].clone(),
                owner: reply[2].clone(),
            }),
            Some("conflict") => Ok(PutOutcome::Conflict),
            _ => Err(StoreError::Unavailable(format!(
                "unexpected reply from the write script: {reply:?}"
            ))),
        }
    }

    /// The app stored under `name`: its JSON as stored and the app it holds.
    async fn stored_app(&self, name: &str) -> Result<Option<(String, App)>, StoreError> {
        let json = self.get_string(format!("{KEY_PREFIX}app:{name}")).await?;
        json.map(|json| decode(name, &json).map(|app| (json, app)))
            .transpose()
    }

    /// With `Some(if_match)`, the JSON of the app stored now if it satisfies it, for a
    /// write that must replace exactly that; `None` when there is no precondition.
    async fn app_matching(
        &self,
        name: &str,
        if_match: Option<&IfMatch>,
    ) -> Result<Option<String>, StoreError> {
        let Some(if_match) = if_match else {
            return Ok(None);
        };
        let stored = self.stored_app(name).await?;
        require_match(name, stored.as_ref().map(|(_, app)| app), if_match)?;
        Ok(stored.map(|(json, _)| json))
    }

    /// Deletes an app if it is still stored as `expected` (any when `None`): whether it
    /// existed, or `None` when it had changed.
    async fn remove_app(
        &self,
        name: &str,
        expected: Option<&str>,
    ) -> Result<Option<bool>, StoreError> {
        let mut invocation = self.delete_app.prepare_invoke();
        invocation.arg(name).arg(expected.unwrap_or(""));
        let reply: Option<String> = self
            .call(|mut c| async move { invocation.invoke_async(&mut c).await })
            .await?;
        match reply.as_deref() {
            Some("conflict") => Ok(None),
            Some(event) => {
                self.announce_own(Some(event));
                self.make_durable().await?;
                Ok(Some(true))
            }
            None => Ok(Some(false)),
        }
    }

    /// Stores a certificate if its description stored now is `expected` (any when `None`):
    /// the script's answer, -1 when it had changed.
    async fn write_cert(
        &self,
        cert: &StoredCertificate,
        expected: Option<&str>,
    ) -> Result<i64, StoreError> {
        let domain = cert.domain.to_string();
        let mut invocation = self.write_cert.prepare_invoke();
        invocation
            .arg(&domain)
            .arg(encode(&domain, cert)?)
            .arg(encode(&domain, &cert.info)?)
            .arg(expiry_key(cert.info.not_after, &domain))
            .arg(expected.unwrap_or(""));
        let written: i64 = self
            .call(|mut c| async move { invocation.invoke_async(&mut c).await })
            .await?;
        if written != -1 {
            self.changes.announce(Change::Cert { domain });
            self.make_durable().await?;
        }
        Ok(written)
    }

    /// Deletes a certificate if its description stored now is `expected` (any when `None`):
    /// 1 removed, 0 none stored, -1 changed.
    async fn remove_cert(&self, domain: &str, expected: Option<&str>) -> Result<i64, StoreError> {
        let mut invocation = self.write_cert.prepare_invoke();
        invocation
            .arg(domain)
            .arg("")
            .arg("")
            .arg("")
            .arg(expected.unwrap_or(""));
        let removed: i64 = self
            .call(|mut c| async move { invocation.invoke_async(&mut c).await })
            .await?;
        if removed == 1 {
            self.changes.announce(Change::Cert {
                domain: domain.to_string(),
            });
            self.make_durable().await?;
        }
        Ok(removed)
    }

    /// With `Some(if_match)`, the description stored for `domain` as JSON if it satisfies
    /// it; `None` when there is no precondition.
    async fn cert_info_matching(
        &self,
        domain: &str,
        if_match: Option<&IfMatch>,
    ) -> Result<Option<String>, StoreError> {
        let Some(if_match) = if_match else {
            return Ok(None);
        };
        let current = self
            .get_string(format!("{KEY_PREFIX}certinfo:{domain}"))
            .await?;
        let info = current
            .as_deref()
            .map(|json| decode::<CertificateInfo>(domain, json))
            .transpose()?;
        require_match(domain, info.as_ref(), if_match)?;
        Ok(current)
    }

    /// Announces a write of this process to its own subscribers at once, rather than only
    /// when the event comes back over Pub/Sub (applying it twice is harmless), so the router
    /// that took a write routes by it as soon as the write returns, even with Pub/Sub down.
    fn announce_own(&self, event: Option<&str>) {
        match event.and_then(parse_event) {
            Some((change, _)) => self.changes.announce(change),
            None => log::warn!("a write script returned no readable event: {event:?}"),
        }
    }

    /// Follows the change channel until `shutdown` resolves, feeding [`Store::subscribe`]'s
    /// receivers. After a reconnection the revision counter says whether events were missed
    /// while unsubscribed; if so, subscribers get [`Change::Resync`] and revalidate their
    /// caches entry by entry.
    async fn follow_pubsub(&self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut last_seen: Option<Position> = None;
        let mut backoff = PUBSUB_BACKOFF_MIN;
        let mut moves = self.link.moves();
        loop {
            let session = self.follow_once(&mut last_seen);
            tokio::select! {
                ended = session => {
                    if ended {
                        backoff = PUBSUB_BACKOFF_MIN;
                    }
                }
                _ = &mut shutdown => return,
            }
            // A failover (even one during the session just ended) ends the wait: the new primary is there to subscribe on now.
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = moves.changed() => backoff = PUBSUB_BACKOFF_MIN,
                _ = &mut shutdown => return,
            }
            backoff = (backoff * 2).min(PUBSUB_BACKOFF_MAX);
        }
    }

    /// One subscription, until the connection drops or the primary moves. Returns whether
    /// it got subscribed.
    async fn follow_once(&self, last_seen: &mut Option<Position>) -> bool {
        let mut moves = self.link.moves();
        moves.borrow_and_update();
        let mut pubsub = match self.link.pubsub().await {
            Ok(pubsub) => pubsub,
            Err(e) => {
                self.report_unreachable(&e.to_string());
                return false;
            }
        };
        self.unreachable_reported.store(false, Ordering::Relaxed);
        if let Err(e) = pubsub.subscribe(CHANGES_CHANNEL).await {
            log::warn!("cannot subscribe to {CHANGES_CHANNEL}: {e}");
            return false;
        }
        // Subscribed first, then read the revision: a change after this read arrives as a
        // message, one before it shows as a revision we have not seen.
        let position = match self.position().await {
            Ok(position) => position,
            Err(e) => {
                log::warn!("subscribed but cannot read the revision: {e}");
                return false;
            }
        };
        match last_seen.as_ref() {
            Some(seen) if *seen == position => {}
            Some(seen) if seen.replication_id != position.replication_id => {
                // Another primary (a promoted replica) may lack writes the old one took, so
                // its revision says nothing about what this router has: revalidate all.
                log::warn!(
                    "the Redis primary's history changed (revision {} -> {}); revalidating \
                     cached routes and certificates",
                    seen.revision,
                    position.revision
                );
                self.changes.announce(Change::Resync);
            }
            Some(seen) => {
                log::warn!(
                    "Redis revision moved from {} to {} while unsubscribed; revalidating \
                     cached routes and certificates",
                    seen.revision,
                    position.revision
                );
                self.changes.announce(Change::Resync);
            }
            // The first subscription of this process: anything cached before it (a 404, a
            // route read while subscribing) may have changed unannounced, so revalidate too.
            None => {
                self.changes.announce(Change::Resync);
            }
        }
        log::info!(
            "following Redis changes on {CHANGES_CHANNEL} (revision {})",
            position.revision
        );
        // Where this session stands; events move its revision on.
        let mut seen = position;
        self.note_following(true, Some(seen.revision));
        metrics::PUBSUB_CONNECTED.set(1);
        let mut messages = pubsub.on_message();
        loop {
            let message = tokio::select! {
                message = messages.next() => message,
                _ = moves.changed() => {
                    log::info!("the Redis primary moved; subscribing on the new one");
                    break;
                }
            };
            let Some(message) = message else { break };
            let Ok(payload) = message.get_payload::<String>() else {
                continue;
            };
            match parse_event(&payload) {
                Some((change, revision)) => {
                    if let Some(rev) = revision {
                        if rev > seen.revision + 1 {
                            // Revisions skipped: a writer bumped it without announcing.
                            self.changes.announce(Change::Resync);
                        }
                        seen.revision = seen.revision.max(rev);
                    }
                    self.note_following(true, Some(seen.revision));
                    self.changes.announce(change);
                }
                None => log::warn!("ignoring a malformed change event: {payload:.200}"),
            }
        }
        *last_seen = Some(seen);
        self.note_following(false, None);
        metrics::PUBSUB_CONNECTED.set(0);
        metrics::PUBSUB_DISCONNECTS.inc();
        log::warn!("the Redis change subscription ended; reconnecting");
        true
    }

    /// Logs the first failed subscription attempt of an outage, not every retry.
    fn report_unreachable(&self, reason: &str) {
        if !self.unreachable_reported.swap(true, Ordering::Relaxed) {
            log::warn!(
                "Redis is unreachable ({reason}); serving cached routes and certificates, \
                 retrying in the background"
            );
        }
    }

    /// The revision and the primary's replication id, read together.
    async fn position(&self) -> Result<Position, StoreError> {
        let (revision, info): (Option<i64>, String) = self
            .call(|mut c| async move {
                redis::pipe()
                    .get(REVISION_KEY)
                    .cmd("INFO")
                    .arg("replication")
                    .query_async(&mut c)
                    .await
            })
            .await?;
        let replication_id = info
            .lines()
            .find_map(|line| line.strip_prefix("master_replid:"))
            .map(|id| id.trim().to_string());
        Ok(Position {
            revision: revision.unwrap_or(0),
            replication_id,
        })
    }
}

/// Where this router stands in the store's history: the revision counter, and the id of
/// the replication history it belongs to (a new one after a failover or a restart).
#[derive(Debug, PartialEq, Eq)]
struct Position {
    revision: i64,
    replication_id: Option<String>,
}

enum PutOutcome {
    Done,
    Conflict,
}

/// What travels on [`CHANGES_CHANNEL`]: the change's own fields and, for a stored change,
/// the revision it made: `{"kind":"app","name":…,"domains":[…],"rev":N}`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct ChangeEvent {
    #[serde(flatten)]
    change: Change,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rev: Option<i64>,
}

fn parse_event(payload: &str) -> Option<(Change, Option<i64>)> {
    let event: ChangeEvent = serde_json::from_str(payload).ok()?;
    Some((event.change, event.rev))
}

fn acme_key(record: AcmeRecord<'_>) -> String {
    format!("{KEY_PREFIX}acme:{}", record.key())
}

/// Puts a filter's record and its module's bytes, and drops the bytes of the module it
/// replaced when no other filter uses them: one script, so that no other writer sees the
/// bytes gone under a record. ARGV: name, record (JSON), SHA-256, bytes.
const PUT_FILTER: &str = r#"
local p = '{KEY_PREFIX}'
local previous = redis.call('HGET', p .. 'filters', ARGV[1])
redis.call('SET', p .. 'filter_module:' .. ARGV[3], ARGV[4])
redis.call('HSET', p .. 'filters', ARGV[1], ARGV[2])
if previous then
  local old = cjson.decode(previous)['sha256']
  if old ~= ARGV[3] then
    for _, v in ipairs(redis.call('HVALS', p .. 'filters')) do
      if cjson.decode(v)['sha256'] == old then return 1 end
    end
    redis.call('DEL', p .. 'filter_module:' .. old)
  end
end
return 1
"#;

/// Deletes a filter's record, and its module's bytes when no other filter uses them.
/// ARGV: name. Returns 1 when there was one.
const DELETE_FILTER: &str = r#"
local p = '{KEY_PREFIX}'
local previous = redis.call('HGET', p .. 'filters', ARGV[1])
if not previous then return 0 end
redis.call('HDEL', p .. 'filters', ARGV[1])
local old = cjson.decode(previous)['sha256']
for _, v in ipairs(redis.call('HVALS', p .. 'filters')) do
  if cjson.decode(v)['sha256'] == old then return 1 end
end
redis.call('DEL', p .. 'filter_module:' .. old)
return 1
"#;

/// A write script with the key prefix written in: the layout's prefix has one source,
/// [`KEY_PREFIX`], in Rust and in Lua alike.
fn script(source: &str) -> Script {
    Script::new(&source.replace("{KEY_PREFIX}", KEY_PREFIX))
}

#[async_trait]
impl Store for RedisStore {
    fn status(&self) -> StoreStatus {
        let following = self.following.lock();
        StoreStatus {
            kind: self.link.kind(),
            location: self.link.location(),
            primary: self.link.primary(),
            available: self.available(),
            subscribed: Some(following.subscribed),
            last_revision: following.last_revision,
            last_sync_unix: following.last_sync_unix,
        }
    }

    async fn follow_changes(
        &self,
        stop: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    ) {
        self.follow_pubsub(stop).await;
    }

    async fn get_app(&self, name: &str) -> Result<Option<App>, StoreError> {
        self.get_string(format!("{KEY_PREFIX}app:{name}"))
            .await?
            .map(|json| decode(name, &json))
            .transpose()
    }

    async fn app_for_domain(&self, domain: &str) -> Result<Option<String>, StoreError> {
        self.get_string(format!("{KEY_PREFIX}domain:{domain}"))
            .await
    }

    async fn list_apps(&self, after: Option<&str>, limit: usize) -> Result<AppPage, StoreError> {
        let (names, more) = self.page_of("apps", after, limit).await?;
        let keys = names
            .iter()
            .map(|n| format!("{KEY_PREFIX}app:{n}"))
            .collect();
        let mut apps = Vec::with_capacity(names.len());
        for (name, json) in names.iter().zip(self.get_many(keys).await?) {
            // An index entry without its record was deleted between the two reads.
            if let Some(json) = json {
                apps.push(decode(name, &json)?);
            }
        }
        Ok(AppPage {
            apps,
            next_after: if more { names.last().cloned() } else { None },
        })
    }

    async fn apply_apps(&self, writes: Vec<AppWrite>) -> Result<(), StoreError> {
        if writes.is_empty() {
            return Ok(());
        }
        // The JSON stored now for each app: a write's expected entity tag is checked here,
        // and the script then checks that JSON is still what is stored, in one atomic step.
        let keys = writes
            .iter()
            .map(|w| format!("{KEY_PREFIX}app:{}", w.name()))
            .collect();
        let stored = self.get_many(keys).await?;
        let mut ops = Vec::with_capacity(writes.len());
        for (write, stored) in writes.iter().zip(stored) {
            let name = write.name();
            let (AppWrite::Put(_, expected) | AppWrite::Delete(_, expected)) = write;
            let current = stored
                .as_deref()
                .map(|json| decode::<App>(name, json))
                .transpose()?;
            if !expected.holds(current.as_ref()) {
                return Err(StoreError::PreconditionFailed(name.to_string()));
            }
            let mut op = serde_json::json!({"name": name, "expected": stored.unwrap_or_default()});
            if let AppWrite::Put(app, _) = write {
                op["json"] = serde_json::Value::String(encode(name, app.as_ref())?);
                op["domains"] = app.domains.iter().map(ToString::to_string).collect();
            }
            ops.push(op);
        }
        let batch = serde_json::Value::Array(ops).to_string();
        let mut invocation = self.apply_apps.prepare_invoke();
        invocation.arg(batch);
        let reply: Vec<String> = self
            .call(|mut c| async move { invocation.invoke_async(&mut c).await })
            .await?;
        match reply.first().map(String::as_str) {
            Some("ok") => {
                for event in &reply[1..] {
                    self.announce_own(Some(event));
                }
                self.make_durable().await
            }
            Some("conflict") if reply.len() == 2 => {
                Err(StoreError::PreconditionFailed(reply[1].clone()))
            }
            Some("taken") if reply.len() == 3 => Err(StoreError::DomainTaken {
                domain: reply[1].clone(),
                owner: reply[2].clone(),
            }),
            _ => Err(StoreError::Unavailable(format!(
                "unexpected reply from the batch script: {reply:?}"
            ))),
        }
    }

    async fn put_app_if(&self, app: App, if_match: Option<&IfMatch>) -> Result<App, StoreError> {
        let name = app.name.to_string();
        for _ in 0..CAS_ATTEMPTS {
            let expected = self.app_matching(&name, if_match).await?;
            // Written only if still what was compared: a write in between is read again.
            if let PutOutcome::Done = self.write_app(&app, expected.as_deref()).await? {
                return Ok(app);
            }
        }
        Err(kept_changing(&format!("app '{name}'")))
    }

    async fn set_backends_if(
        &self,
        name: &str,
        backends: Vec<Backend>,
        if_match: Option<&IfMatch>,
    ) -> Result<App, StoreError> {
        for _ in 0..CAS_ATTEMPTS {
            let stored = self.stored_app(name).await?;
            if let Some(if_match) = if_match {
                require_match(name, stored.as_ref().map(|(_, app)| app), if_match)?;
            }
            let Some((current, mut app)) = stored else {
                return Err(StoreError::AppNotFound(name.to_string()));
            };
            app.backends = backends.clone();
            if let PutOutcome::Done = self.write_app(&app, Some(&current)).await? {
                return Ok(app);
            }
        }
        Err(kept_changing(&format!("app '{name}'")))
    }

    async fn delete_app_if(
        &self,
        name: &str,
        if_match: Option<&IfMatch>,
    ) -> Result<bool, StoreError> {
        for _ in 0..CAS_ATTEMPTS {
            let expected = self.app_matching(name, if_match).await?;
            if let Some(deleted) = self.remove_app(name, expected.as_deref()).await? {
                return Ok(deleted);
            }
        }
        Err(kept_changing(&format!("app '{name}'")))
    }

    async fn get_cert(&self, domain: &str) -> Result<Option<StoredCertificate>, StoreError> {
        self.get_string(format!("{KEY_PREFIX}cert:{domain}"))
            .await?
            .map(|json| decode(domain, &json))
            .transpose()
    }

    async fn acme_get(&self, record: AcmeRecord<'_>) -> Result<Option<String>, StoreError> {
        let key = acme_key(record);
        self.call(|mut c| async move { c.get::<_, Option<String>>(key).await })
            .await
    }

    async fn acme_put(
        &self,
        record: AcmeRecord<'_>,
        json: String,
        ttl: Option<Duration>,
    ) -> Result<(), StoreError> {
        let key = acme_key(record);
        let index = matches!(record, AcmeRecord::Domain(_));
        let member = match record {
            AcmeRecord::Domain(domain) => domain.to_string(),
            _ => String::new(),
        };
        self.call(|mut c| async move {
            let mut pipe = redis::pipe();
            pipe.atomic();
            match ttl {
                Some(ttl) => pipe.pset_ex(&key, json, ttl.as_millis().max(1) as u64),
                None => pipe.set(&key, json),
            };
            if index {
                pipe.zadd(format!("{KEY_PREFIX}acme:domains"), member, 0);
            }
            pipe.query_async::<()>(&mut c).await
        })
        .await
    }

    async fn acme_delete(&self, record: AcmeRecord<'_>) -> Result<(), StoreError> {
        let key = acme_key(record);
        let member = match record {
            AcmeRecord::Domain(domain) => Some(domain.to_string()),
            _ => None,
        };
        self.call(|mut c| async move {
            let mut pipe = redis::pipe();
            pipe.atomic().del(&key);
            if let Some(member) = member {
                pipe.zrem(format!("{KEY_PREFIX}acme:domains"), member);
            }
            pipe.query_async::<()>(&mut c).await
        })
        .await
    }

    async fn acme_domains(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<String>, Option<String>), StoreError> {
        let (domains, more) = self.page_of("acme:domains", after, limit).await?;
        let keys = domains
            .iter()
            .map(|d| acme_key(AcmeRecord::Domain(d)))
            .collect();
        let records = self.get_many(keys).await?.into_iter().flatten().collect();
        Ok((records, if more { domains.last().cloned() } else { None }))
    }

    async fn acme_lease(&self, holder: &str, ttl: Duration) -> Result<Option<u64>, StoreError> {
        let mut invocation = self.acme_lease.prepare_invoke();
        invocation.arg(holder).arg(ttl.as_millis().max(1) as u64);
        self.call(|mut c| async move { invocation.invoke_async::<Option<u64>>(&mut c).await })
            .await
    }

    async fn acme_release(&self, holder: &str) -> Result<(), StoreError> {
        let mut invocation = self.acme_release.prepare_invoke();
        invocation.arg(holder);
        self.call(|mut c| async move { invocation.invoke_async::<i64>(&mut c).await })
            .await
            .map(drop)
    }

    async fn fleet_secret(&self, name: &str, candidate: String) -> Result<String, StoreError> {
        let key = format!("{KEY_PREFIX}secret:{name}");
        // SET NX then GET in one transaction: the first router's candidate is kept, and
        // every router reads the kept one.
        let (_, kept): (Option<String>, String) = self
            .call(|mut c| async move {
                redis::pipe()
                    .atomic()
                    .cmd("SET")
                    .arg(&key)
                    .arg(candidate)
                    .arg("NX")
                    .get(&key)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        Ok(kept)
    }

    async fn tokens(&self) -> Result<Vec<ApiToken>, StoreError> {
        let key = format!("{KEY_PREFIX}tokens");
        let all: Vec<(String, String)> = self
            .call(|mut c| async move { c.hgetall(key).await })
            .await?;
        all.iter().map(|(id, json)| decode(id, json)).collect()
    }

    async fn get_token(&self, id: &str) -> Result<Option<ApiToken>, StoreError> {
        let key = format!("{KEY_PREFIX}tokens");
        let field = id.to_string();
        let json: Option<String> = self
            .call(|mut c| async move { c.hget(key, field).await })
            .await?;
        json.map(|json| decode(id, &json)).transpose()
    }

    async fn put_token(&self, token: ApiToken) -> Result<(), StoreError> {
        let key = format!("{KEY_PREFIX}tokens");
        let json = encode(&token.id, &token)?;
        self.call(|mut c| async move { c.hset::<_, _, _, ()>(key, token.id, json).await })
            .await
    }

    async fn delete_token(&self, id: &str) -> Result<bool, StoreError> {
        let key = format!("{KEY_PREFIX}tokens");
        let field = id.to_string();
        let removed: u64 = self
            .call(|mut c| async move { c.hdel(key, field).await })
            .await?;
        Ok(removed > 0)
    }

    async fn put_filter(&self, name: &str, module: Vec<u8>) -> Result<FilterModule, StoreError> {
        let record = crate::filter_record(name, &module);
        let json = encode(name, &record)?;
        let put = script(PUT_FILTER);
        let mut invocation = put.prepare_invoke();
        invocation
            .arg(name)
            .arg(json)
            .arg(&record.sha256)
            .arg(module);
        let _: i64 = self
            .call(|mut c| async move { invocation.invoke_async(&mut c).await })
            .await?;
        self.tell_every_router(Change::Filter {
            name: name.to_string(),
        })
        .await?;
        Ok(record)
    }

    async fn get_filter(&self, name: &str) -> Result<Option<FilterModule>, StoreError> {
        let key = format!("{KEY_PREFIX}filters");
        let field = name.to_string();
        let json: Option<String> = self
            .call(|mut c| async move { c.hget(key, field).await })
            .await?;
        json.map(|json| decode(name, &json)).transpose()
    }

    async fn list_filters(&self) -> Result<Vec<FilterModule>, StoreError> {
        let key = format!("{KEY_PREFIX}filters");
        let all: Vec<(String, String)> = self
            .call(|mut c| async move { c.hgetall(key).await })
            .await?;
        let mut filters: Vec<FilterModule> = all
            .iter()
            .map(|(name, json)| decode(name, json))
            .collect::<Result<_, _>>()?;
        filters.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(filters)
    }

    async fn filter_bytes(&self, sha256: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let key = format!("{KEY_PREFIX}filter_module:{sha256}");
        self.call(|mut c| async move { c.get(key).await }).await
    }

    async fn delete_filter(&self, name: &str) -> Result<bool, StoreError> {
        let delete = script(DELETE_FILTER);
        let mut invocation = delete.prepare_invoke();
        invocation.arg(name);
        let removed: i64 = self
            .call(|mut c| async move { invocation.invoke_async(&mut c).await })
            .await?;
        if removed > 0 {
            self.tell_every_router(Change::Filter {
                name: name.to_string(),
            })
            .await?;
        }
        Ok(removed > 0)
    }

    async fn append_audit(&self, record: AuditRecord, keep: usize) -> Result<u64, StoreError> {
        let key = format!("{KEY_PREFIX}audit");
        let json = encode(&key, &record)?;
        // XADD trims to `keep` exactly; the length before tells how many went.
        let (before, _): (u64, String) = self
            .call(|mut c| async move {
                redis::pipe()
                    .atomic()
                    .cmd("XLEN")
                    .arg(&key)
                    .cmd("XADD")
                    .arg(&key)
                    .arg("MAXLEN")
                    .arg(keep)
                    .arg("*")
                    .arg("r")
                    .arg(json)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        Ok((before + 1).saturating_sub(keep as u64))
    }

    async fn audit(&self, query: &AuditQuery) -> Result<AuditPage, StoreError> {
        /// Entries read per round trip while filtering.
        const BATCH: usize = 1000;
        let key = format!("{KEY_PREFIX}audit");
        let mut page = AuditPage::default();
        let mut end = query
            .before
            .as_ref()
            .map_or_else(|| "+".to_string(), |cursor| format!("({cursor}"));
        loop {
            let (key, from) = (key.clone(), end.clone());
            let entries: Vec<(String, std::collections::HashMap<String, String>)> = self
                .call(|mut c| async move {
                    redis::cmd("XREVRANGE")
                        .arg(key)
                        .arg(from)
                        .arg("-")
                        .arg("COUNT")
                        .arg(BATCH)
                        .query_async(&mut c)
                        .await
                })
                .await?;
            let exhausted = entries.len() < BATCH;
            for (cursor, fields) in entries {
                end = format!("({cursor}");
                let Some(json) = fields.get("r") else {
                    continue;
                };
                let record = AuditRecord {
                    cursor: cursor.clone(),
                    ..decode(&cursor, json)?
                };
                if query.since_ms.is_some_and(|since| record.at_ms < since) {
                    return Ok(page);
                }
                if !query.wants(&record) {
                    continue;
                }
                if page.records.len() == query.limit {
                    page.next = page.records.last().map(|r| r.cursor.clone());
                    return Ok(page);
                }
                page.records.push(record);
            }
            if exhausted {
                return Ok(page);
            }
        }
    }

    async fn acme_lease_holder(&self) -> Result<Option<(String, u64)>, StoreError> {
        let key = format!("{KEY_PREFIX}acme:lease");
        let value: Option<String> = self
            .call(|mut c| async move { c.get::<_, Option<String>>(key).await })
            .await?;
        Ok(value.and_then(|v| {
            let (token, holder) = v.split_once(' ')?;
            Some((holder.to_string(), token.parse().ok()?))
        }))
    }

    async fn list_certs(&self, after: Option<&str>, limit: usize) -> Result<CertPage, StoreError> {
        let (domains, more) = self.page_of("certs", after, limit).await?;
        let certs = self.cert_infos(&domains).await?;
        Ok(CertPage {
            certs,
            next_after: if more { domains.last().cloned() } else { None },
        })
    }

    async fn list_certs_by_expiry(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<CertPage, StoreError> {
        self.ensure_expiry_index().await?;
        let (keys, more) = self.page_of("certs:expiry", after, limit).await?;
        let domains: Vec<&str> = keys
            .iter()
            .map(|key| {
                key.split_once('|')
                    .map_or(key.as_str(), |(_, domain)| domain)
            })
            .collect();
        let certs = self.cert_infos(&domains).await?;
        Ok(CertPage {
            certs,
            next_after: if more { keys.last().cloned() } else { None },
        })
    }

    async fn put_cert_if(
        &self,
        cert: StoredCertificate,
        if_match: Option<&IfMatch>,
    ) -> Result<CertificateInfo, StoreError> {
        let domain = cert.domain.to_string();
        for _ in 0..CAS_ATTEMPTS {
            let expected = self.cert_info_matching(&domain, if_match).await?;
            if self.write_cert(&cert, expected.as_deref()).await? != -1 {
                return Ok(cert.info);
            }
        }
        Err(kept_changing(&format!("the certificate of '{domain}'")))
    }

    async fn delete_cert_if(
        &self,
        domain: &str,
        if_match: Option<&IfMatch>,
    ) -> Result<bool, StoreError> {
        for _ in 0..CAS_ATTEMPTS {
            let expected = self.cert_info_matching(domain, if_match).await?;
            match self.remove_cert(domain, expected.as_deref()).await? {
                -1 => continue,
                removed => return Ok(removed == 1),
            }
        }
        Err(kept_changing(&format!("the certificate of '{domain}'")))
    }

    async fn tell_every_router(&self, change: Change) -> Result<(), StoreError> {
        let event = encode(
            "a change event",
            &ChangeEvent {
                change: change.clone(),
                rev: None,
            },
        )?;
        self.call(|mut c| async move { c.publish::<_, _, i64>(CHANGES_CHANNEL, event).await })
            .await?;
        self.changes.announce(change);
        Ok(())
    }

    fn subscribe(&self) -> Subscription {
        self.changes.subscribe()
    }

    fn announced(&self) -> u64 {
        self.changes.announced()
    }

    fn available(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_has_one_prefix_in_rust_and_in_lua() {
        assert_eq!(CHANGES_CHANNEL, format!("{KEY_PREFIX}changes"));
        assert_eq!(REVISION_KEY, format!("{KEY_PREFIX}revision"));
        for source in [
            PUT_APP,
            DELETE_APP,
            APPLY_APPS,
            WRITE_CERT,
            ACME_LEASE,
            ACME_RELEASE,
        ] {
            assert!(source.contains("local p = '{KEY_PREFIX}'"));
            assert!(
                !source.contains("switchyard:"),
                "written in from KEY_PREFIX"
            );
        }
    }

    #[test]
    fn plain_and_tls_urls_are_accepted_without_connecting() {
        for url in ["redis://127.0.0.1:1/0", "rediss://:secret@127.0.0.1:1/3"] {
            assert!(
                RedisStore::new(url, RedisTimeouts::default()).is_ok(),
                "{url}"
            );
        }
        assert!(RedisStore::new("http://x", RedisTimeouts::default()).is_err());
    }

    #[test]
    fn events_carry_the_change_and_its_revision() {
        let (change, rev) =
            parse_event(r#"{"kind":"app","name":"shop","domains":["shop.example.com"],"rev":42}"#)
                .expect("valid event");
        assert_eq!(
            change,
            Change::App {
                name: "shop".into(),
                domains: vec!["shop.example.com".into()]
            }
        );
        assert_eq!(rev, Some(42));
        let (change, rev) = parse_event(r#"{"kind":"cert","domain":"*.x.com"}"#).expect("valid");
        assert_eq!(
            change,
            Change::Cert {
                domain: "*.x.com".into()
            }
        );
        assert_eq!(rev, None);
        assert!(parse_event("nonsense").is_none());
    }
}
