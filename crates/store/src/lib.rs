//! Switchyard's source of truth: the [`Store`] trait and its implementations. The admin API
//! writes through it; the proxy's caches read through it and listen to its
//! [`Change`](switchyard_model::Change) events.
//! Nothing else holds routing state that outlives a cache entry. Two implementations: the
//! embedded redb file (one router) and Redis (a fleet of routers sharing one store).

pub mod acme;
pub mod audit;
mod backup;
mod embedded;
mod error;
mod feed;
mod json;
mod metrics;
mod redis_link;
mod redis_store;
mod redis_target;

use async_trait::async_trait;
pub use backup::{inspect as inspect_backup, restore, Backup, BackupContents, Restored};
pub use embedded::EmbeddedStore;
pub use error::StoreError;
pub use feed::{ChangeFeed, Subscription};
pub use redis_link::{LinkError, RedisLink, RedisTimeouts};
pub use redis_store::{RedisStore, WriteAcks, CHANGES_CHANNEL, KEY_PREFIX};
pub use redis_target::RedisTarget;

use switchyard_model::{
    ApiToken, App, AuditPage, AuditQuery, AuditRecord, Backend, CertificateInfo, Change,
    FilterModule, IfMatch, StoredCertificate,
};

/// How many change events a subscriber may fall behind before it must resync everything.
pub const CHANGE_CHANNEL_CAPACITY: usize = 4096;

/// A page of apps, ordered by name.
#[derive(Debug, Clone)]
pub struct AppPage {
    /// Apps in this page.
    pub apps: Vec<App>,
    /// Pass as `after` to get the next page; `None` on the last page.
    pub next_after: Option<String>,
}

/// A page of certificate descriptions (never keys), ordered by domain or by expiry.
#[derive(Debug, Clone)]
pub struct CertPage {
    /// Certificates in this page.
    pub certs: Vec<CertificateInfo>,
    /// Pass as `after` to get the next page; `None` on the last page.
    pub next_after: Option<String>,
}

/// The key of a certificate in the expiry index, the same in every store: its end of
/// validity in 12 digits (seconds since the epoch, clamped to what 12 digits hold), so keys
/// sort by expiry, then its domain, so two certificates never share a key. Pages by expiry
/// continue after such a key.
pub(crate) fn expiry_key(not_after: i64, domain: &str) -> String {
    format!("{:012}|{domain}", not_after.clamp(0, 999_999_999_999))
}

/// Where the store stands, as `GET /v1/store` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub struct StoreStatus {
    /// `embedded`, `redis` or `redis+sentinel`.
    pub kind: &'static str,
    /// The redb file, the Redis server as `host:port/db`, or the Sentinels as
    /// `sentinel:MASTER@host:port,…/db` (never a password).
    pub location: String,
    /// The Redis server written to (behind Sentinels: the primary last found), `host:port`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub primary: Option<String>,
    /// Whether the last call succeeded.
    pub available: bool,
    /// Whether the change subscription (Redis Pub/Sub) is up; `None` for a store with none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subscribed: Option<bool>,
    /// The last store revision this router saw (Redis: on subscribing and in each event).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_revision: Option<i64>,
    /// When this router last knew itself in step with the store: its subscription made or
    /// an event received (seconds since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_sync_unix: Option<i64>,
}

/// A record the ACME issuer keeps in the store.
#[derive(Debug, Clone, Copy)]
pub enum AcmeRecord<'a> {
    /// The fleet's account credentials at a CA, by directory URL: created once per fleet.
    Account(&'a str),
    /// A domain's certificate state ([`switchyard_model::AcmeDomain`]).
    Domain(&'a str),
    /// An HTTP-01 answer by token ([`switchyard_model::AcmeChallenge`]).
    Challenge(&'a str),
    /// A TLS-ALPN-01 answer by domain ([`switchyard_model::AcmeTlsAlpnAnswer`]).
    TlsAlpn(&'a str),
}

impl AcmeRecord<'_> {
    /// Its key, the same in every store (Redis puts the layout's prefix before it):
    /// `account:{directory}`, `domain:{domain}`, `challenge:{token}`, `tls-alpn:{domain}`.
    pub(crate) fn key(&self) -> String {
        match self {
            AcmeRecord::Account(directory) => format!("account:{directory}"),
            AcmeRecord::Domain(domain) => format!("domain:{domain}"),
            AcmeRecord::Challenge(token) => format!("challenge:{token}"),
            AcmeRecord::TlsAlpn(domain) => format!("tls-alpn:{domain}"),
        }
    }
}

/// What an app must be stored as for one write of a batch to apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// No app of that name.
    Absent,
    /// The app whose entity tag is this.
    Tag(String),
}

impl Expected {
    /// Whether `current`, the app stored now, is the one expected.
    pub fn holds(&self, current: Option<&App>) -> bool {
        match (self, current) {
            (Self::Absent, current) => current.is_none(),
            (Self::Tag(tag), Some(app)) => switchyard_model::entity_tag_of(app) == *tag,
            (Self::Tag(_), None) => false,
        }
    }
}

/// One write of a batch ([`Store::apply_apps`]).
#[derive(Debug, Clone)]
pub enum AppWrite {
    /// Create or replace the app.
    Put(Box<App>, Expected),
    /// Delete the app of this name.
    Delete(String, Expected),
}

impl AppWrite {
    /// The app the write is about.
    pub fn name(&self) -> &str {
        match self {
            Self::Put(app, _) => app.name.as_str(),
            Self::Delete(name, _) => name,
        }
    }
}

/// Writes a bulk import keeps under way at once on a store without one of its own.
const BULK_WRITES_IN_FLIGHT: usize = 64;

/// Where apps and certificates live. Every write is durable when it returns and is announced to subscribers.
#[async_trait]
pub trait Store: Send + Sync {
    /// The app with this name.
    async fn get_app(&self, name: &str) -> Result<Option<App>, StoreError>;

    /// Applies `writes` in order, each only if its app is stored as expected; the first one
    /// refused stops the batch with its error ([`StoreError::PreconditionFailed`],
    /// [`StoreError::DomainTaken`]). Both stores apply a batch all or nothing (the embedded
    /// store in one transaction, Redis in one script); this default applies each write
    /// atomically and conditionally, but the writes before a refused one stay.
    async fn apply_apps(&self, writes: Vec<AppWrite>) -> Result<(), StoreError> {
        for write in writes {
            let name = write.name().to_string();
            let (expected, put) = match write {
                AppWrite::Put(app, expected) => (expected, Some(app)),
                AppWrite::Delete(_, expected) => (expected, None),
            };
            let if_match = match &expected {
                Expected::Tag(tag) => Some(IfMatch::Tags(vec![tag.clone()])),
                Expected::Absent => {
                    if self.get_app(&name).await?.is_some() {
                        return Err(StoreError::PreconditionFailed(name));
                    }
                    None
                }
            };
            match put {
                Some(app) => {
                    self.put_app_if(*app, if_match.as_ref()).await?;
                }
                None => {
                    self.delete_app_if(&name, if_match.as_ref()).await?;
                }
            }
        }
        Ok(())
    }

    /// The name of the app that owns exactly this domain (as stored: `*.x.com` for wildcards).
    async fn app_for_domain(&self, domain: &str) -> Result<Option<String>, StoreError>;

    /// Apps ordered by name, starting after `after`, at most `limit`.
    async fn list_apps(&self, after: Option<&str>, limit: usize) -> Result<AppPage, StoreError>;

    /// Creates or replaces an app. Fails with [`StoreError::DomainTaken`] (and stores nothing)
    /// when one of its domains belongs to another app.
    async fn put_app(&self, app: App) -> Result<App, StoreError> {
        self.put_app_if(app, None).await
    }

    /// [`Store::put_app`], with `Some(if_match)` only if the app stored now satisfies it
    /// (compared with its [`entity_tag_of`](switchyard_model::entity_tag_of)), in the same
    /// atomic step as the write; otherwise [`StoreError::PreconditionFailed`] and nothing is
    /// written.
    async fn put_app_if(&self, app: App, if_match: Option<&IfMatch>) -> Result<App, StoreError>;

    /// [`Store::set_backends`] under an optional `If-Match`, as [`Store::put_app_if`].
    async fn set_backends_if(
        &self,
        name: &str,
        backends: Vec<Backend>,
        if_match: Option<&IfMatch>,
    ) -> Result<App, StoreError>;

    /// [`Store::delete_app`] under an optional `If-Match`, as [`Store::put_app_if`].
    async fn delete_app_if(
        &self,
        name: &str,
        if_match: Option<&IfMatch>,
    ) -> Result<bool, StoreError>;

    /// Creates or replaces many apps (a bulk import). Each app is written wholly or not at
    /// all and gets its own result, in order: one refused for a domain owned elsewhere does
    /// not stop the others. `Err` only when the store itself failed, and then the
    /// results of the apps already written are lost to the caller, not their writes: the
    /// import is safe to run again, every put being a replacement.
    async fn put_apps(&self, apps: Vec<App>) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        use futures_util::StreamExt;
        // Concurrent puts: a networked store pipelines them on its connection.
        let results: Vec<Result<App, StoreError>> = futures_util::stream::iter(apps)
            .map(|app| self.put_app(app))
            .buffered(BULK_WRITES_IN_FLIGHT)
            .collect()
            .await;
        results
            .into_iter()
            .map(|result| match result {
                Ok(_) => Ok(Ok(())),
                Err(refused @ StoreError::DomainTaken { .. }) => Ok(Err(refused)),
                Err(failed) => Err(failed),
            })
            .collect()
    }

    /// Replaces an existing app's backends (scale up / down / redeploy).
    async fn set_backends(&self, name: &str, backends: Vec<Backend>) -> Result<App, StoreError> {
        self.set_backends_if(name, backends, None).await
    }

    /// Deletes an app; `false` when it did not exist.
    async fn delete_app(&self, name: &str) -> Result<bool, StoreError> {
        self.delete_app_if(name, None).await
    }

    /// The certificate stored under exactly `domain` (`*.x.com` for a wildcard), with its key.
    async fn get_cert(&self, domain: &str) -> Result<Option<StoredCertificate>, StoreError>;

    /// Descriptions of stored certificates ordered by domain, after `after`, at most `limit`.
    async fn list_certs(&self, after: Option<&str>, limit: usize) -> Result<CertPage, StoreError>;

    /// Descriptions of stored certificates ordered by expiry, soonest first, after the
    /// cursor `after` (a page's `next_after`), at most `limit`: the dashboard's "expiring
    /// soon" list reads one page, whatever the number of certificates.
    async fn list_certs_by_expiry(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<CertPage, StoreError>;

    /// Creates or replaces the certificate for its domain.
    async fn put_cert(&self, cert: StoredCertificate) -> Result<CertificateInfo, StoreError> {
        self.put_cert_if(cert, None).await
    }

    /// Deletes the certificate of `domain`; `false` when there was none.
    async fn delete_cert(&self, domain: &str) -> Result<bool, StoreError> {
        self.delete_cert_if(domain, None).await
    }

    /// [`Store::put_cert`], with `Some(if_match)` only if the certificate stored now
    /// satisfies it (compared with the entity tag of its description), as
    /// [`Store::put_app_if`].
    async fn put_cert_if(
        &self,
        cert: StoredCertificate,
        if_match: Option<&IfMatch>,
    ) -> Result<CertificateInfo, StoreError>;

    /// [`Store::delete_cert`] under an optional `If-Match`, as [`Store::put_cert_if`].
    async fn delete_cert_if(
        &self,
        domain: &str,
        if_match: Option<&IfMatch>,
    ) -> Result<bool, StoreError>;

    /// Tells every router sharing this store, this one included, of a change that is not
    /// stored and only travels ([`Change::CachePurge`](switchyard_model::Change::CachePurge),
    /// [`Change::WafReload`](switchyard_model::Change::WafReload)): it reaches them on the
    /// path every stored change takes.
    async fn tell_every_router(&self, change: Change) -> Result<(), StoreError>;

    /// Tells every router sharing this store to drop cached responses of `app` under `path`
    /// (a [`Change::CachePurge`](switchyard_model::Change::CachePurge)); nothing is stored.
    async fn purge_cache(&self, app: &str, path: &str, prefix: bool) -> Result<(), StoreError> {
        self.tell_every_router(Change::CachePurge {
            app: app.to_string(),
            path: path.to_string(),
            prefix,
        })
        .await
    }

    /// One record of the ACME issuer's, as JSON (see [`acme`] for the typed view).
    async fn acme_get(&self, record: AcmeRecord<'_>) -> Result<Option<String>, StoreError>;

    /// Writes one record of the ACME issuer's; with `ttl`, it is gone after that long.
    /// ACME records are not routing state: no change event is announced.
    async fn acme_put(
        &self,
        record: AcmeRecord<'_>,
        json: String,
        ttl: Option<std::time::Duration>,
    ) -> Result<(), StoreError>;

    /// Deletes one record of the ACME issuer's (nothing when absent).
    async fn acme_delete(&self, record: AcmeRecord<'_>) -> Result<(), StoreError>;

    /// The domains' ACME records (JSON) ordered by domain, after `after`, at most `limit`,
    /// and the `after` of the next page.
    async fn acme_domains(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<String>, Option<String>), StoreError>;

    /// Takes or extends the fleet's issuing lease for `holder`, for `ttl`. Returns the
    /// lease's fencing token (it grows with every new holder) while `holder` holds it,
    /// `None` while another does.
    async fn acme_lease(
        &self,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<Option<u64>, StoreError>;

    /// Gives the lease up if `holder` holds it (a router stopping).
    async fn acme_release(&self, holder: &str) -> Result<(), StoreError>;

    /// Who holds the issuing lease now, if anyone: `holder` and its fencing token.
    async fn acme_lease_holder(&self) -> Result<Option<(String, u64)>, StoreError>;

    /// The fleet's secret named `name`: `candidate` if none was kept yet (it is kept then),
    /// else the one kept — the same for every router of the fleet (e.g. the key that signs
    /// sticky-session cookies, so that any router honours another's).
    async fn fleet_secret(&self, name: &str, candidate: String) -> Result<String, StoreError>;

    /// The admin API's tokens, in no order.
    async fn tokens(&self) -> Result<Vec<ApiToken>, StoreError>;

    /// The token with this id.
    async fn get_token(&self, id: &str) -> Result<Option<ApiToken>, StoreError>;

    /// Keeps a new token (its id is new: made of random bytes by the caller).
    async fn put_token(&self, token: ApiToken) -> Result<(), StoreError>;

    /// Revokes a token; whether there was one.
    async fn delete_token(&self, id: &str) -> Result<bool, StoreError>;

    /// Stores `module` under `name` (its bytes kept once by their SHA-256, the module it
    /// replaces forgotten when no other name uses it) and tells every router.
    async fn put_filter(&self, name: &str, module: Vec<u8>) -> Result<FilterModule, StoreError>;

    /// The stored module named `name`.
    async fn get_filter(&self, name: &str) -> Result<Option<FilterModule>, StoreError>;

    /// Every stored module, by name.
    async fn list_filters(&self) -> Result<Vec<FilterModule>, StoreError>;

    /// The bytes of the module whose SHA-256 is `sha256`.
    async fn filter_bytes(&self, sha256: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// Forgets the module named `name` (and its bytes when no other name uses them) and
    /// tells every router; whether there was one.
    async fn delete_filter(&self, name: &str) -> Result<bool, StoreError>;

    /// Appends a record to the audit log, keeping the newest `keep`; answers how many older
    /// records went to make room.
    async fn append_audit(&self, record: AuditRecord, keep: usize) -> Result<u64, StoreError>;

    /// The audit log's records the query asks for, newest first.
    async fn audit(&self, query: &AuditQuery) -> Result<AuditPage, StoreError>;

    /// Whether the store answered its last call. Caches use it to count what they serve
    /// while the store is away; a store that cannot fail is always available.
    fn available(&self) -> bool {
        true
    }

    /// Where the store stands: kind, location, subscription, last revision seen.
    fn status(&self) -> StoreStatus;

    /// A consistent copy of the whole store, taken while it serves. `None`: this store is
    /// backed up by its own server (Redis: its RDB snapshots or AOF).
    async fn backup(&self) -> Result<Option<Backup>, StoreError> {
        Ok(None)
    }

    /// Change events from now on. A subscriber that falls more than
    /// [`CHANGE_CHANNEL_CAPACITY`] events behind sees `Lagged` and must resync.
    fn subscribe(&self) -> Subscription;

    /// Brings the changes other processes make to [`Store::subscribe`]'s receivers, until
    /// `stop` resolves. The Redis store follows its Pub/Sub channel (reconnecting, and
    /// telling subscribers to resync after a gap); the embedded store, which only this
    /// process writes, has nothing to follow. Every router runs it, whatever its store.
    async fn follow_changes(
        &self,
        stop: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    ) {
        stop.await;
    }

    /// How many change events this process has announced so far. Once a write returns, its
    /// own event is among them (a Redis store announces its writes locally too), so a
    /// subscriber that has applied this many events has applied the write.
    fn announced(&self) -> u64;
}

/// Seconds since the epoch.
/// Refuses a write whose `If-Match` the stored record (`current`: an app, a certificate's
/// description) does not satisfy.
pub(crate) fn require_match<T: serde::Serialize>(
    name: &str,
    current: Option<&T>,
    if_match: &IfMatch,
) -> Result<(), StoreError> {
    let tag = current.map(switchyard_model::entity_tag_of);
    if if_match.matches(tag.as_deref()) {
        Ok(())
    } else {
        Err(StoreError::PreconditionFailed(name.to_string()))
    }
}

/// What is stored of a filter's module besides its bytes: its name, its SHA-256 (hex, the
/// key its bytes are kept under), its size, now.
pub(crate) fn filter_record(name: &str, module: &[u8]) -> FilterModule {
    FilterModule {
        name: name.to_string(),
        sha256: (openssl::sha::sha256(module).iter())
            .map(|b| format!("{b:02x}"))
            .collect(),
        size: module.len() as u64,
        updated_unix: unix_now(),
    }
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What each metric of this crate is, for the reference (`switchyard reference`).
pub fn metric_docs() -> Vec<switchyard_metrics::MetricDoc> {
    metrics::documented()
}
