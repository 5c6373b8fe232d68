//! The default store: one crash-safe redb file in the data directory, for a single router
//! with no set-up. Every write transaction is fsynced before it returns, so an app that the
//! admin API acknowledged survives `kill -9` and power loss.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::{Mutex, RwLock};
use redb::{
    Database, DatabaseError, ReadableTable, ReadableTableMetadata, TableDefinition,
    WriteTransaction,
};
use switchyard_model::{
    AcmeDomain, ApiToken, App, AuditPage, AuditQuery, AuditRecord, Backend, CertificateInfo,
    Change, FilterModule, IfMatch, StoredCertificate,
};

use crate::json::encode;
use crate::{expiry_key, require_match, unix_now};
use crate::{
    AcmeRecord, AppPage, AppWrite, CertPage, ChangeFeed, Store, StoreError, StoreStatus,
    Subscription,
};

/// App name → the app as JSON.
pub(crate) const APPS: TableDefinition<&str, &[u8]> = TableDefinition::new("apps");
/// Domain (as stored) → owning app name: the routing index.
pub(crate) const DOMAINS: TableDefinition<&str, &str> = TableDefinition::new("domains");

/// Domain → certificate with key, as JSON: read on a handshake's cache miss only.
pub(crate) const CERTS: TableDefinition<&str, &[u8]> = TableDefinition::new("certs");
/// Domain → certificate description, as JSON: listings and expiry scans read these small
/// records without touching keys.
pub(crate) const CERT_INFO: TableDefinition<&str, &[u8]> = TableDefinition::new("cert_info");
/// [`expiry_key`] → domain: certificates ordered by expiry, for listings that start with
/// those expiring soonest.
pub(crate) const CERT_EXPIRY: TableDefinition<&str, &[u8]> = TableDefinition::new("cert_expiry");

/// The ACME issuer's records, keyed `account:{directory}`, `domain:{domain}` and
/// `challenge:{token}`; each value is its expiry (seconds since the epoch, big-endian, 0 for
/// never) followed by its JSON.
pub(crate) const ACME: TableDefinition<&str, &[u8]> = TableDefinition::new("acme");
/// The fleet's secrets by name (`Store::fleet_secret`), written once.
pub(crate) const SECRETS: TableDefinition<&str, &str> = TableDefinition::new("secrets");
/// The admin API's tokens by id, as JSON (the secret's digest, never the secret).
pub(crate) const TOKENS: TableDefinition<&str, &[u8]> = TableDefinition::new("tokens");
/// The audit log: a sequence number (20 digits, so that keys sort as numbers) → record,
/// as JSON.
pub(crate) const AUDIT: TableDefinition<&str, &[u8]> = TableDefinition::new("audit");
/// The proxy-wasm filters by name, as JSON (`FilterModule`).
pub(crate) const FILTERS: TableDefinition<&str, &[u8]> = TableDefinition::new("filters");
/// The filters' modules by SHA-256 (hex): each kept once, whatever names it has.
pub(crate) const FILTER_MODULES: TableDefinition<&str, &[u8]> =
    TableDefinition::new("filter_modules");
/// The key ranges of the ACME records written with an expiry: the answers of open orders.
const EXPIRING_RECORDS: [(&str, &str); 2] =
    [("challenge:", "challenge;"), ("tls-alpn:", "tls-alpn;")];
/// The expiry of an ACME record kept until deleted.
const NEVER_EXPIRES: u64 = 0;

/// redb's page cache. Routes and certificates are cached above the store, which reads a
/// record once per fill: the cache needs the B-trees' branch pages (about 100 KiB at
/// 100,000 apps), not the leaves, which the kernel's page cache keeps anyway. At 16 MiB it
/// filled with leaves and cost 168 B per app at 100,000 apps.
const PAGE_CACHE_BYTES: usize = 4 * 1024 * 1024;
pub(crate) const FILE_NAME: &str = "switchyard.redb";
/// How often a router taking over from another (binary upgrade) tries the file again.
const HANDOVER_POLL: Duration = Duration::from_millis(10);

/// The embedded, file-backed store.
#[derive(Clone)]
pub struct EmbeddedStore {
    /// `None` once released: redb locks its file to one process, and a router handing over
    /// to its successor must let go of it.
    db: Arc<RwLock<Option<Arc<Database>>>>,
    changes: Arc<ChangeFeed>,
    /// The issuing lease: one process uses this file, so it lives in memory.
    lease: Arc<Mutex<Lease>>,
    /// The redb file, for the status.
    file: Arc<std::path::PathBuf>,
}

/// The ACME issuing lease of a single process.
#[derive(Debug, Default)]
struct Lease {
    holder: Option<(String, Instant, u64)>,
    last_token: u64,
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `data_dir`, creating the directory if needed.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        Self::open_when_released(data_dir, Duration::ZERO)
    }

    /// Like [`EmbeddedStore::open`], waiting up to `wait` for another process (the router
    /// this one replaces) to release the file.
    pub fn open_when_released(data_dir: &Path, wait: Duration) -> Result<Self, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|e| {
            StoreError::Unavailable(format!("cannot create {}: {e}", data_dir.display()))
        })?;
        let path = data_dir.join(FILE_NAME);
        let started = Instant::now();
        let db = loop {
            match Database::builder()
                .set_cache_size(PAGE_CACHE_BYTES)
                .create(&path)
            {
                Ok(db) => break db,
                Err(DatabaseError::DatabaseAlreadyOpen) if started.elapsed() < wait => {
                    std::thread::sleep(HANDOVER_POLL);
                }
                Err(DatabaseError::DatabaseAlreadyOpen) => {
                    return Err(StoreError::Unavailable(format!(
                        "{} is in use by another router process (a running router, or one \
                         that has not released it within {wait:?} of an upgrade)",
                        path.display()
                    )))
                }
                Err(e) => {
                    return Err(StoreError::Unavailable(format!(
                        "cannot open {}: {e}",
                        path.display()
                    )))
                }
            }
        };
        let txn = db.begin_write().map_err(unavailable)?;
        txn.open_table(APPS).map_err(unavailable)?;
        txn.open_table(DOMAINS).map_err(unavailable)?;
        txn.open_table(CERTS).map_err(unavailable)?;
        txn.open_table(CERT_INFO).map_err(unavailable)?;
        index_expiries(&txn)?;
        txn.open_table(ACME).map_err(unavailable)?;
        txn.open_table(SECRETS).map_err(unavailable)?;
        txn.open_table(TOKENS).map_err(unavailable)?;
        txn.open_table(AUDIT).map_err(unavailable)?;
        txn.open_table(FILTERS).map_err(unavailable)?;
        txn.open_table(FILTER_MODULES).map_err(unavailable)?;
        txn.commit().map_err(unavailable)?;
        Ok(Self {
            db: Arc::new(RwLock::new(Some(Arc::new(db)))),
            changes: Arc::default(),
            lease: Arc::default(),
            file: Arc::new(path.to_path_buf()),
        })
    }

    /// Closes the file for the router process that replaces this one; every later
    /// operation fails as unavailable (routes already cached keep serving). The file is
    /// unlocked once transactions under way have finished.
    pub fn release(&self) {
        self.db.write().take();
    }

    fn db(&self) -> Result<Arc<Database>, StoreError> {
        self.db.read().clone().ok_or_else(|| {
            StoreError::Unavailable("the store was handed over to a new router process".into())
        })
    }

    fn read_app(&self, name: &str) -> Result<Option<App>, StoreError> {
        let txn = self.db()?.begin_read().map_err(unavailable)?;
        let apps = txn.open_table(APPS).map_err(unavailable)?;
        let value = apps.get(name).map_err(unavailable)?;
        value.map(|v| decode_app(name, v.value())).transpose()
    }

    fn write_app(&self, app: &App, if_match: Option<&IfMatch>) -> Result<Change, StoreError> {
        let txn = self.db()?.begin_write().map_err(unavailable)?;
        if let Some(if_match) = if_match {
            let current = read_app_in(&txn, app.name.as_str())?;
            require_match(app.name.as_str(), current.as_ref(), if_match)?;
        }
        let change = write_app_in(&txn, app)?;
        // The transaction is aborted on drop if `write_app_in` failed: nothing half-written.
        txn.commit().map_err(unavailable)?;
        Ok(change)
    }

    /// Writes many apps in one transaction, for bulk imports and benchmarks. No change events
    /// are sent: use it on a store no running router is serving from.
    pub fn import_apps(&self, apps: &[App]) -> Result<(), StoreError> {
        let txn = self.db()?.begin_write().map_err(unavailable)?;
        for app in apps {
            write_app_in(&txn, app)?;
        }
        txn.commit().map_err(unavailable)
    }

    /// Writes many certificates in one transaction, like [`EmbeddedStore::import_apps`].
    pub fn import_certs(&self, certs: &[StoredCertificate]) -> Result<(), StoreError> {
        let txn = self.db()?.begin_write().map_err(unavailable)?;
        for cert in certs {
            write_cert_in(&txn, cert)?;
        }
        txn.commit().map_err(unavailable)
    }

    /// Writes many domains' ACME states in one transaction, like
    /// [`EmbeddedStore::import_apps`]: benchmarks start a router over thousands of issued
    /// certificates without issuing them.
    pub fn import_acme_domains(&self, states: &[AcmeDomain]) -> Result<(), StoreError> {
        let txn = self.db()?.begin_write().map_err(unavailable)?;
        {
            let mut table = txn.open_table(ACME).map_err(unavailable)?;
            for state in states {
                let key = AcmeRecord::Domain(&state.domain).key();
                let value = acme_value(NEVER_EXPIRES, &encode(&key, state)?);
                table
                    .insert(key.as_str(), value.as_slice())
                    .map_err(unavailable)?;
            }
        }
        txn.commit().map_err(unavailable)
    }

    fn write_cert(
        &self,
        cert: &StoredCertificate,
        if_match: Option<&IfMatch>,
    ) -> Result<(), StoreError> {
        let txn = self.db()?.begin_write().map_err(unavailable)?;
        if let Some(if_match) = if_match {
            let domain = cert.domain.as_str();
            require_match(domain, read_cert_info_in(&txn, domain)?.as_ref(), if_match)?;
        }
        write_cert_in(&txn, cert)?;
        txn.commit().map_err(unavailable)
    }

    fn remove_cert(&self, domain: &str, if_match: Option<&IfMatch>) -> Result<bool, StoreError> {
        let txn = self.db()?.begin_write().map_err(unavailable)?;
        if let Some(if_match) = if_match {
            require_match(domain, read_cert_info_in(&txn, domain)?.as_ref(), if_match)?;
        }
        let existed = {
            let mut certs = txn.open_table(CERTS).map_err(unavailable)?;
            let mut info = txn.open_table(CERT_INFO).map_err(unavailable)?;
            let mut expiries = txn.open_table(CERT_EXPIRY).map_err(unavailable)?;
            if let Some(old) = info.remove(domain).map_err(unavailable)? {
                let old: CertificateInfo = decode(domain, old.value())?;
                expiries
                    .remove(expiry_key(old.not_after, domain).as_str())
                    .map_err(unavailable)?;
            }
            let existed = certs.remove(domain).map_err(unavailable)?.is_some();
            existed
        };
        txn.commit().map_err(unavailable)?;
        Ok(existed)
    }

    fn remove_app(
        &self,
        name: &str,
        if_match: Option<&IfMatch>,
    ) -> Result<Option<Change>, StoreError> {
        let txn = self.db()?.begin_write().map_err(unavailable)?;
        if let Some(if_match) = if_match {
            require_match(name, read_app_in(&txn, name)?.as_ref(), if_match)?;
        }
        let removed = remove_app_in(&txn, name)?;
        txn.commit().map_err(unavailable)?;
        Ok(removed)
    }

    fn announce(&self, change: Change) {
        self.changes.announce(change);
    }

    /// [`Store::apply_apps`] in one transaction: every write or none.
    fn apply_in_one_transaction(&self, writes: &[AppWrite]) -> Result<Vec<Change>, StoreError> {
        let txn = self.db()?.begin_write().map_err(unavailable)?;
        let mut changes = Vec::with_capacity(writes.len());
        for write in writes {
            let name = write.name();
            let (AppWrite::Put(_, expected) | AppWrite::Delete(_, expected)) = write;
            if !expected.holds(read_app_in(&txn, name)?.as_ref()) {
                // Dropped without a commit: nothing of the batch stays.
                return Err(StoreError::PreconditionFailed(name.to_string()));
            }
            match write {
                AppWrite::Put(app, _) => changes.push(write_app_in(&txn, app)?),
                AppWrite::Delete(..) => changes.extend(remove_app_in(&txn, name)?),
            }
        }
        txn.commit().map_err(unavailable)?;
        Ok(changes)
    }

    /// Runs a blocking store operation (a write that fsyncs) off the async runtime.
    async fn blocking<T, F>(&self, op: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&EmbeddedStore) -> Result<T, StoreError> + Send + 'static,
    {
        let store = self.clone();
        tokio::task::spawn_blocking(move || op(&store))
            .await
            .map_err(|e| StoreError::Unavailable(format!("store task failed: {e}")))?
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    // Reads run inline: a redb read of a cached page takes microseconds, and they only happen
    // on a route-cache miss. Writes fsync, so they go to the blocking pool.
    async fn get_app(&self, name: &str) -> Result<Option<App>, StoreError> {
        self.read_app(name)
    }

    async fn app_for_domain(&self, domain: &str) -> Result<Option<String>, StoreError> {
        let txn = self.db()?.begin_read().map_err(unavailable)?;
        let domains = txn.open_table(DOMAINS).map_err(unavailable)?;
        let owner = domains.get(domain).map_err(unavailable)?;
        Ok(owner.map(|o| o.value().to_string()))
    }

    async fn list_apps(&self, after: Option<&str>, limit: usize) -> Result<AppPage, StoreError> {
        let txn = self.db()?.begin_read().map_err(unavailable)?;
        let apps = txn.open_table(APPS).map_err(unavailable)?;
        let (apps, next_after) = read_page(&apps, after, limit, decode_app)?;
        Ok(AppPage { apps, next_after })
    }

    /// One transaction (one fsync) for the whole import: 20,000 puts of their own would
    /// each wait for the disk.
    async fn put_apps(&self, apps: Vec<App>) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let (results, changes) = self
            .blocking(move |store| {
                let txn = store.db()?.begin_write().map_err(unavailable)?;
                let mut results = Vec::with_capacity(apps.len());
                let mut changes = Vec::new();
                for app in &apps {
                    match write_app_in(&txn, app) {
                        Ok(change) => {
                            changes.push(change);
                            results.push(Ok(()));
                        }
                        // Refused before this app wrote anything: the others go on.
                        Err(refused @ StoreError::DomainTaken { .. }) => results.push(Err(refused)),
                        // The transaction is aborted on drop: nothing of the import stays.
                        Err(failed) => return Err(failed),
                    }
                }
                txn.commit().map_err(unavailable)?;
                Ok((results, changes))
            })
            .await?;
        for change in changes {
            self.announce(change);
        }
        Ok(results)
    }

    async fn set_backends_if(
        &self,
        name: &str,
        backends: Vec<Backend>,
        if_match: Option<&IfMatch>,
    ) -> Result<App, StoreError> {
        let (name, if_match) = (name.to_string(), if_match.cloned());
        let (app, change) = self
            .blocking(move |store| {
                // Read and written in one write transaction: redb allows one writer at a
                // time, so a PUT of the same app lands wholly before or after this, never
                // between the read and the write (where its other fields would be lost).
                let txn = store.db()?.begin_write().map_err(unavailable)?;
                let current = read_app_in(&txn, &name)?;
                if let Some(if_match) = &if_match {
                    require_match(&name, current.as_ref(), if_match)?;
                }
                let mut app = current.ok_or_else(|| StoreError::AppNotFound(name.clone()))?;
                app.backends = backends;
                let change = write_app_in(&txn, &app)?;
                txn.commit().map_err(unavailable)?;
                Ok((app, change))
            })
            .await?;
        self.announce(change);
        Ok(app)
    }

    async fn apply_apps(&self, writes: Vec<AppWrite>) -> Result<(), StoreError> {
        let changes = self
            .blocking(move |store| store.apply_in_one_transaction(&writes))
            .await?;
        for change in changes {
            self.announce(change);
        }
        Ok(())
    }

    async fn put_app_if(&self, app: App, if_match: Option<&IfMatch>) -> Result<App, StoreError> {
        let if_match = if_match.cloned();
        let (app, change) = self
            .blocking(move |store| {
                let change = store.write_app(&app, if_match.as_ref())?;
                Ok((app, change))
            })
            .await?;
        self.announce(change);
        Ok(app)
    }

    async fn delete_app_if(
        &self,
        name: &str,
        if_match: Option<&IfMatch>,
    ) -> Result<bool, StoreError> {
        let (name, if_match) = (name.to_string(), if_match.cloned());
        let change = self
            .blocking(move |store| store.remove_app(&name, if_match.as_ref()))
            .await?;
        match change {
            Some(change) => {
                self.announce(change);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    async fn get_cert(&self, domain: &str) -> Result<Option<StoredCertificate>, StoreError> {
        let txn = self.db()?.begin_read().map_err(unavailable)?;
        let certs = txn.open_table(CERTS).map_err(unavailable)?;
        let value = certs.get(domain).map_err(unavailable)?;
        value.map(|v| decode(domain, v.value())).transpose()
    }

    async fn list_certs(&self, after: Option<&str>, limit: usize) -> Result<CertPage, StoreError> {
        let txn = self.db()?.begin_read().map_err(unavailable)?;
        let info = txn.open_table(CERT_INFO).map_err(unavailable)?;
        let (certs, next_after) = read_page(&info, after, limit, |key, value| {
            decode::<CertificateInfo>(key, value)
        })?;
        Ok(CertPage { certs, next_after })
    }

    async fn list_certs_by_expiry(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<CertPage, StoreError> {
        let txn = self.db()?.begin_read().map_err(unavailable)?;
        let info = txn.open_table(CERT_INFO).map_err(unavailable)?;
        let expiries = txn.open_table(CERT_EXPIRY).map_err(unavailable)?;
        let (certs, next_after) = read_page(&expiries, after, limit, |key, domain| {
            let domain = std::str::from_utf8(domain).map_err(|e| StoreError::Corrupt {
                key: key.to_string(),
                reason: e.to_string(),
            })?;
            // Written in the same transaction as the index: a missing record is a damaged file.
            let value =
                info.get(domain)
                    .map_err(unavailable)?
                    .ok_or_else(|| StoreError::Corrupt {
                        key: key.to_string(),
                        reason: format!("indexed, but no certificate is stored for {domain}"),
                    })?;
            decode::<CertificateInfo>(domain, value.value())
        })?;
        Ok(CertPage { certs, next_after })
    }

    async fn put_cert_if(
        &self,
        cert: StoredCertificate,
        if_match: Option<&IfMatch>,
    ) -> Result<CertificateInfo, StoreError> {
        let (domain, if_match) = (cert.domain.to_string(), if_match.cloned());
        let info = self
            .blocking(move |store| {
                store.write_cert(&cert, if_match.as_ref())?;
                Ok(cert.info)
            })
            .await?;
        self.announce(Change::Cert { domain });
        Ok(info)
    }

    async fn delete_cert_if(
        &self,
        domain: &str,
        if_match: Option<&IfMatch>,
    ) -> Result<bool, StoreError> {
        let (owned, if_match) = (domain.to_string(), if_match.cloned());
        let existed = self
            .blocking(move |store| store.remove_cert(&owned, if_match.as_ref()))
            .await?;
        if existed {
            self.announce(Change::Cert {
                domain: domain.to_string(),
            });
        }
        Ok(existed)
    }

    async fn tell_every_router(&self, change: Change) -> Result<(), StoreError> {
        // One router to a store: this one.
        self.announce(change);
        Ok(())
    }

    async fn backup(&self) -> Result<Option<crate::Backup>, StoreError> {
        let db = self.db()?;
        let dir = self.file.parent().unwrap_or(Path::new(".")).to_path_buf();
        // Copying reads and writes the whole file: off the runtime's threads.
        tokio::task::spawn_blocking(move || crate::backup::snapshot(&db, &dir).map(Some))
            .await
            .map_err(|e| StoreError::Unavailable(format!("backup task failed: {e}")))?
    }

    fn status(&self) -> StoreStatus {
        StoreStatus {
            kind: "embedded",
            location: self.file.display().to_string(),
            primary: None,
            available: self.db().is_ok(),
            subscribed: None,
            last_revision: None,
            last_sync_unix: None,
        }
    }

    async fn acme_get(&self, record: AcmeRecord<'_>) -> Result<Option<String>, StoreError> {
        let key = record.key();
        let txn = self.db()?.begin_read().map_err(unavailable)?;
        let table = txn.open_table(ACME).map_err(unavailable)?;
        let value = table.get(key.as_str()).map_err(unavailable)?;
        Ok(value.and_then(|v| unexpired(v.value(), unix_now()).map(str::to_string)))
    }

    async fn acme_put(
        &self,
        record: AcmeRecord<'_>,
        json: String,
        ttl: Option<Duration>,
    ) -> Result<(), StoreError> {
        let key = record.key();
        let expires = ttl.map_or(NEVER_EXPIRES, |ttl| {
            unix_now().saturating_add(ttl.as_secs().max(1))
        });
        let value = acme_value(expires, &json);
        self.blocking(move |store| {
            let txn = store.db()?.begin_write().map_err(unavailable)?;
            {
                let mut table = txn.open_table(ACME).map_err(unavailable)?;
                table
                    .insert(key.as_str(), value.as_slice())
                    .map_err(unavailable)?;
                // Answers of orders that never cleaned up after themselves go with the next.
                if ttl.is_some() {
                    let now = unix_now();
                    for (from, to) in EXPIRING_RECORDS {
                        table
                            .retain_in::<&str, _>(from..to, |_, v| unexpired(v, now).is_some())
                            .map_err(unavailable)?;
                    }
                }
            }
            txn.commit().map_err(unavailable)
        })
        .await
    }

    async fn acme_delete(&self, record: AcmeRecord<'_>) -> Result<(), StoreError> {
        let key = record.key();
        self.blocking(move |store| {
            let txn = store.db()?.begin_write().map_err(unavailable)?;
            txn.open_table(ACME)
                .map_err(unavailable)?
                .remove(key.as_str())
                .map_err(unavailable)?;
            txn.commit().map_err(unavailable)
        })
        .await
    }

    async fn acme_domains(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<String>, Option<String>), StoreError> {
        let txn = self.db()?.begin_read().map_err(unavailable)?;
        let table = txn.open_table(ACME).map_err(unavailable)?;
        let start = after.map_or_else(|| "domain:".to_string(), |a| format!("domain:{a}"));
        let lower = match after {
            Some(_) => std::ops::Bound::Excluded(start.as_str()),
            None => std::ops::Bound::Included(start.as_str()),
        };
        let mut range = table
            .range::<&str>((lower, std::ops::Bound::Excluded("domain;")))
            .map_err(unavailable)?;
        let mut page = Vec::new();
        let mut last = None;
        for entry in range.by_ref().take(limit) {
            let (key, value) = entry.map_err(unavailable)?;
            if let Some(json) = unexpired(value.value(), u64::MIN) {
                page.push(json.to_string());
            }
            last = key.value().strip_prefix("domain:").map(str::to_string);
        }
        let next = if range.next().is_some() { last } else { None };
        Ok((page, next))
    }

    async fn acme_lease(&self, holder: &str, ttl: Duration) -> Result<Option<u64>, StoreError> {
        let now = Instant::now();
        let mut lease = self.lease.lock();
        match &mut lease.holder {
            Some((current, expires, token)) if *expires > now => {
                if current != holder {
                    return Ok(None);
                }
                *expires = now + ttl;
                Ok(Some(*token))
            }
            _ => {
                lease.last_token += 1;
                let token = lease.last_token;
                lease.holder = Some((holder.to_string(), now + ttl, token));
                Ok(Some(token))
            }
        }
    }

    async fn acme_release(&self, holder: &str) -> Result<(), StoreError> {
        let mut lease = self.lease.lock();
        if lease.holder.as_ref().is_some_and(|(h, _, _)| h == holder) {
            lease.holder = None;
        }
        Ok(())
    }

    async fn fleet_secret(&self, name: &str, candidate: String) -> Result<String, StoreError> {
        let name = name.to_string();
        self.blocking(move |store| {
            let txn = store.db()?.begin_write().map_err(unavailable)?;
            let kept = {
                let mut table = txn.open_table(SECRETS).map_err(unavailable)?;
                let kept = table
                    .get(name.as_str())
                    .map_err(unavailable)?
                    .map(|v| v.value().to_string());
                match kept {
                    Some(kept) => kept,
                    None => {
                        table
                            .insert(name.as_str(), candidate.as_str())
                            .map_err(unavailable)?;
                        candidate
                    }
                }
            };
            txn.commit().map_err(unavailable)?;
            Ok(kept)
        })
        .await
    }

    async fn tokens(&self) -> Result<Vec<ApiToken>, StoreError> {
        self.blocking(|store| {
            let txn = store.db()?.begin_read().map_err(unavailable)?;
            let table = txn.open_table(TOKENS).map_err(unavailable)?;
            let mut tokens = Vec::new();
            for entry in table.iter().map_err(unavailable)? {
                let (id, value) = entry.map_err(unavailable)?;
                tokens.push(decode_json(id.value(), value.value())?);
            }
            Ok(tokens)
        })
        .await
    }

    async fn get_token(&self, id: &str) -> Result<Option<ApiToken>, StoreError> {
        let txn = self.db()?.begin_read().map_err(unavailable)?;
        let table = txn.open_table(TOKENS).map_err(unavailable)?;
        let value = table.get(id).map_err(unavailable)?;
        value.map(|v| decode_json(id, v.value())).transpose()
    }

    async fn put_token(&self, token: ApiToken) -> Result<(), StoreError> {
        let json = encode(&token.id, &token)?;
        self.blocking(move |store| {
            let txn = store.db()?.begin_write().map_err(unavailable)?;
            txn.open_table(TOKENS)
                .map_err(unavailable)?
                .insert(token.id.as_str(), json.as_bytes())
                .map_err(unavailable)?;
            txn.commit().map_err(unavailable)
        })
        .await
    }

    async fn delete_token(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.blocking(move |store| {
            let txn = store.db()?.begin_write().map_err(unavailable)?;
            let removed = txn
                .open_table(TOKENS)
                .map_err(unavailable)?
                .remove(id.as_str())
                .map_err(unavailable)?
                .is_some();
            txn.commit().map_err(unavailable)?;
            Ok(removed)
        })
        .await
    }

    async fn put_filter(&self, name: &str, module: Vec<u8>) -> Result<FilterModule, StoreError> {
        let record = crate::filter_record(name, &module);
        let json = encode(name, &record)?;
        let kept = record.clone();
        self.blocking(move |store| {
            let txn = store.db()?.begin_write().map_err(unavailable)?;
            {
                let mut names = txn.open_table(FILTERS).map_err(unavailable)?;
                let previous = names
                    .insert(kept.name.as_str(), json.as_bytes())
                    .map_err(unavailable)?
                    .map(|v| decode_json::<FilterModule>(&kept.name, v.value()))
                    .transpose()?;
                let mut modules = txn.open_table(FILTER_MODULES).map_err(unavailable)?;
                modules
                    .insert(kept.sha256.as_str(), module.as_slice())
                    .map_err(unavailable)?;
                if let Some(previous) = previous.filter(|p| p.sha256 != kept.sha256) {
                    if !sha_in_use(&names, &previous.sha256)? {
                        modules
                            .remove(previous.sha256.as_str())
                            .map_err(unavailable)?;
                    }
                }
            }
            txn.commit().map_err(unavailable)
        })
        .await?;
        self.announce(Change::Filter {
            name: name.to_string(),
        });
        Ok(record)
    }

    async fn get_filter(&self, name: &str) -> Result<Option<FilterModule>, StoreError> {
        let txn = self.db()?.begin_read().map_err(unavailable)?;
        let table = txn.open_table(FILTERS).map_err(unavailable)?;
        let value = table.get(name).map_err(unavailable)?;
        value.map(|v| decode_json(name, v.value())).transpose()
    }

    async fn list_filters(&self) -> Result<Vec<FilterModule>, StoreError> {
        let txn = self.db()?.begin_read().map_err(unavailable)?;
        let table = txn.open_table(FILTERS).map_err(unavailable)?;
        let mut filters = Vec::new();
        for entry in table.iter().map_err(unavailable)? {
            let (name, value) = entry.map_err(unavailable)?;
            filters.push(decode_json(name.value(), value.value())?);
        }
        Ok(filters)
    }

    async fn filter_bytes(&self, sha256: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let txn = self.db()?.begin_read().map_err(unavailable)?;
        let table = txn.open_table(FILTER_MODULES).map_err(unavailable)?;
        let value = table.get(sha256).map_err(unavailable)?;
        Ok(value.map(|v| v.value().to_vec()))
    }

    async fn delete_filter(&self, name: &str) -> Result<bool, StoreError> {
        let owned = name.to_string();
        let removed = self
            .blocking(move |store| {
                let txn = store.db()?.begin_write().map_err(unavailable)?;
                let removed = {
                    let mut names = txn.open_table(FILTERS).map_err(unavailable)?;
                    let previous = names
                        .remove(owned.as_str())
                        .map_err(unavailable)?
                        .map(|v| decode_json::<FilterModule>(&owned, v.value()))
                        .transpose()?;
                    if let Some(previous) = &previous {
                        if !sha_in_use(&names, &previous.sha256)? {
                            let mut modules =
                                txn.open_table(FILTER_MODULES).map_err(unavailable)?;
                            modules
                                .remove(previous.sha256.as_str())
                                .map_err(unavailable)?;
                        }
                    }
                    previous.is_some()
                };
                txn.commit().map_err(unavailable)?;
                Ok(removed)
            })
            .await?;
        if removed {
            self.announce(Change::Filter {
                name: name.to_string(),
            });
        }
        Ok(removed)
    }

    async fn append_audit(&self, record: AuditRecord, keep: usize) -> Result<u64, StoreError> {
        self.blocking(move |store| {
            let txn = store.db()?.begin_write().map_err(unavailable)?;
            let trimmed = {
                let mut table = txn.open_table(AUDIT).map_err(unavailable)?;
                let last = table.last().map_err(unavailable)?;
                let next = last.map_or(0, |(key, _)| key.value().parse::<u64>().unwrap_or(0)) + 1;
                let cursor = format!("{next:020}");
                let json = encode(
                    &cursor,
                    &AuditRecord {
                        cursor: cursor.clone(),
                        ..record
                    },
                )?;
                table
                    .insert(cursor.as_str(), json.as_bytes())
                    .map_err(unavailable)?;
                let mut trimmed = 0;
                while table.len().map_err(unavailable)? > keep as u64 {
                    table.pop_first().map_err(unavailable)?;
                    trimmed += 1;
                }
                trimmed
            };
            txn.commit().map_err(unavailable)?;
            Ok(trimmed)
        })
        .await
    }

    async fn audit(&self, query: &AuditQuery) -> Result<AuditPage, StoreError> {
        let query = query.clone();
        self.blocking(move |store| {
            let txn = store.db()?.begin_read().map_err(unavailable)?;
            let table = txn.open_table(AUDIT).map_err(unavailable)?;
            let before = query.before.as_deref().unwrap_or("~");
            let mut page = AuditPage::default();
            for entry in table.range::<&str>(..before).map_err(unavailable)?.rev() {
                let (cursor, value) = entry.map_err(unavailable)?;
                let record: AuditRecord = decode_json(cursor.value(), value.value())?;
                if query.since_ms.is_some_and(|since| record.at_ms < since) {
                    break;
                }
                if !query.wants(&record) {
                    continue;
                }
                if page.records.len() == query.limit {
                    page.next = page.records.last().map(|r| r.cursor.clone());
                    break;
                }
                page.records.push(record);
            }
            Ok(page)
        })
        .await
    }

    async fn acme_lease_holder(&self) -> Result<Option<(String, u64)>, StoreError> {
        let lease = self.lease.lock();
        Ok(lease
            .holder
            .as_ref()
            .filter(|(_, expires, _)| *expires > Instant::now())
            .map(|(holder, _, token)| (holder.clone(), *token)))
    }

    fn subscribe(&self) -> Subscription {
        self.changes.subscribe()
    }

    fn announced(&self) -> u64 {
        self.changes.announced()
    }
}

/// Puts `app` and its domain index entries inside `txn`, refusing domains owned by another
/// app; returns the change naming every domain whose routing may have moved.
/// The description of the certificate stored for `domain`, read inside a write transaction.
fn read_cert_info_in(
    txn: &WriteTransaction,
    domain: &str,
) -> Result<Option<CertificateInfo>, StoreError> {
    let info = txn.open_table(CERT_INFO).map_err(unavailable)?;
    let value = info.get(domain).map_err(unavailable)?;
    value.map(|v| decode(domain, v.value())).transpose()
}

/// The app stored under `name`, read inside a write transaction.
fn read_app_in(txn: &WriteTransaction, name: &str) -> Result<Option<App>, StoreError> {
    let apps = txn.open_table(APPS).map_err(unavailable)?;
    let value = apps.get(name).map_err(unavailable)?;
    value.map(|v| decode_app(name, v.value())).transpose()
}

/// Removes the app `name` and its domains; its change, if there was one.
fn remove_app_in(txn: &WriteTransaction, name: &str) -> Result<Option<Change>, StoreError> {
    let mut apps = txn.open_table(APPS).map_err(unavailable)?;
    let mut domains = txn.open_table(DOMAINS).map_err(unavailable)?;
    let previous = apps
        .remove(name)
        .map_err(unavailable)?
        .map(|v| decode_app(name, v.value()))
        .transpose()?;
    let Some(app) = previous else {
        return Ok(None);
    };
    for domain in &app.domains {
        domains.remove(domain.as_str()).map_err(unavailable)?;
    }
    Ok(Some(Change::App {
        name: name.to_string(),
        domains: app.domains.iter().map(ToString::to_string).collect(),
    }))
}

fn write_app_in(txn: &WriteTransaction, app: &App) -> Result<Change, StoreError> {
    let name = app.name.as_str();
    let encoded = serde_json::to_vec(app).map_err(|e| StoreError::Corrupt {
        key: name.to_string(),
        reason: e.to_string(),
    })?;
    let mut apps = txn.open_table(APPS).map_err(unavailable)?;
    let mut domains = txn.open_table(DOMAINS).map_err(unavailable)?;
    for domain in &app.domains {
        if let Some(owner) = domains.get(domain.as_str()).map_err(unavailable)? {
            if owner.value() != name {
                return Err(StoreError::DomainTaken {
                    domain: domain.to_string(),
                    owner: owner.value().to_string(),
                });
            }
        }
    }
    let previous = apps
        .get(name)
        .map_err(unavailable)?
        .map(|v| decode_app(name, v.value()))
        .transpose()?;
    let mut touched: Vec<String> = Vec::new();
    if let Some(previous) = &previous {
        for old in &previous.domains {
            if !app.domains.contains(old) {
                domains.remove(old.as_str()).map_err(unavailable)?;
            }
            touched.push(old.to_string());
        }
    }
    for domain in &app.domains {
        domains.insert(domain.as_str(), name).map_err(unavailable)?;
        if !touched.iter().any(|t| t == domain.as_str()) {
            touched.push(domain.to_string());
        }
    }
    apps.insert(name, encoded.as_slice()).map_err(unavailable)?;
    Ok(Change::App {
        name: name.to_string(),
        domains: touched,
    })
}

fn write_cert_in(txn: &WriteTransaction, cert: &StoredCertificate) -> Result<(), StoreError> {
    let domain = cert.domain.as_str();
    let corrupt = |e: serde_json::Error| StoreError::Corrupt {
        key: domain.to_string(),
        reason: e.to_string(),
    };
    let full = serde_json::to_vec(cert).map_err(corrupt)?;
    let info = serde_json::to_vec(&cert.info).map_err(corrupt)?;
    let mut certs = txn.open_table(CERTS).map_err(unavailable)?;
    let mut infos = txn.open_table(CERT_INFO).map_err(unavailable)?;
    let mut expiries = txn.open_table(CERT_EXPIRY).map_err(unavailable)?;
    certs.insert(domain, full.as_slice()).map_err(unavailable)?;
    if let Some(old) = infos.insert(domain, info.as_slice()).map_err(unavailable)? {
        let old: CertificateInfo = decode(domain, old.value())?;
        expiries
            .remove(expiry_key(old.not_after, domain).as_str())
            .map_err(unavailable)?;
    }
    expiries
        .insert(
            expiry_key(cert.info.not_after, domain).as_str(),
            domain.as_bytes(),
        )
        .map_err(unavailable)?;
    Ok(())
}

/// Builds the expiry index again when it does not match the certificates (a file written
/// before the index existed): read at every start, rebuilt only then.
fn index_expiries(txn: &WriteTransaction) -> Result<(), StoreError> {
    use redb::ReadableTableMetadata;
    let infos = txn.open_table(CERT_INFO).map_err(unavailable)?;
    let mut expiries = txn.open_table(CERT_EXPIRY).map_err(unavailable)?;
    if infos.len().map_err(unavailable)? == expiries.len().map_err(unavailable)? {
        return Ok(());
    }
    expiries.retain(|_, _| false).map_err(unavailable)?;
    for entry in infos.iter().map_err(unavailable)? {
        let (domain, value) = entry.map_err(unavailable)?;
        let info: CertificateInfo = decode(domain.value(), value.value())?;
        expiries
            .insert(
                expiry_key(info.not_after, domain.value()).as_str(),
                domain.value().as_bytes(),
            )
            .map_err(unavailable)?;
    }
    Ok(())
}

/// Up to `limit` records of `table` after the key `after`, decoded, and the key to continue
/// from when more remain.
fn read_page<T>(
    table: &redb::ReadOnlyTable<&str, &[u8]>,
    after: Option<&str>,
    limit: usize,
    decode_one: impl Fn(&str, &[u8]) -> Result<T, StoreError>,
) -> Result<(Vec<T>, Option<String>), StoreError> {
    let mut range = match after {
        Some(after) => {
            table.range::<&str>((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
        }
        None => table.range::<&str>(..),
    }
    .map_err(unavailable)?;
    let mut page = Vec::new();
    let mut last_key = None;
    for entry in range.by_ref().take(limit) {
        let (key, value) = entry.map_err(unavailable)?;
        page.push(decode_one(key.value(), value.value())?);
        last_key = Some(key.value().to_string());
    }
    let next_after = if range.next().is_some() {
        last_key
    } else {
        None
    };
    Ok((page, next_after))
}

/// An ACME record as the table keeps it: its expiry, then its JSON ([`unexpired`] reads it).
fn acme_value(expires: u64, json: &str) -> Vec<u8> {
    let mut value = expires.to_be_bytes().to_vec();
    value.extend_from_slice(json.as_bytes());
    value
}

/// The JSON of an ACME record unless it expired by `now` (seconds since the epoch).
fn unexpired(value: &[u8], now: u64) -> Option<&str> {
    let (expires, json) = value.split_first_chunk::<8>()?;
    let expires = u64::from_be_bytes(*expires);
    if expires != 0 && expires <= now {
        return None;
    }
    std::str::from_utf8(json).ok()
}

pub(crate) fn decode_app(key: &str, bytes: &[u8]) -> Result<App, StoreError> {
    decode(key, bytes)
}

fn decode<T: serde::de::DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        key: key.to_string(),
        reason: e.to_string(),
    })
}

pub(crate) fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// A JSON record of `key` in one of the store's own tables.
fn decode_json<T: serde::de::DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        key: key.to_string(),
        reason: e.to_string(),
    })
}

/// Whether a stored filter other than the one just changed uses the module `sha256`.
fn sha_in_use(names: &redb::Table<'_, &str, &[u8]>, sha256: &str) -> Result<bool, StoreError> {
    for entry in names.iter().map_err(unavailable)? {
        let (name, value) = entry.map_err(unavailable)?;
        let record: FilterModule = decode_json(name.value(), value.value())?;
        if record.sha256 == sha256 {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_model::parse_app_spec;

    fn app(name: &str, domains: &[&str]) -> App {
        parse_app_spec(
            name,
            &serde_json::json!({"domains": domains, "backends": ["127.0.0.1:9001"]}),
        )
        .expect("valid app")
    }

    #[tokio::test]
    async fn apps_survive_reopening() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let store = EmbeddedStore::open(dir.path()).expect("open");
            store.put_app(app("one", &["one.test"])).await.expect("put");
        }
        let store = EmbeddedStore::open(dir.path()).expect("reopen");
        assert_eq!(
            store
                .app_for_domain("one.test")
                .await
                .expect("read")
                .as_deref(),
            Some("one")
        );
        assert!(store.get_app("one").await.expect("read").is_some());
    }

    #[tokio::test]
    async fn a_fleet_secret_is_made_once_and_survives_a_reopening() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let store = EmbeddedStore::open(dir.path()).expect("open");
            let first = store
                .fleet_secret("affinity", "aaaa".into())
                .await
                .expect("secret");
            assert_eq!(first, "aaaa", "the first candidate is kept");
            let second = store
                .fleet_secret("affinity", "bbbb".into())
                .await
                .expect("secret");
            assert_eq!(second, "aaaa", "later candidates are not");
            let other = store
                .fleet_secret("other", "cccc".into())
                .await
                .expect("secret");
            assert_eq!(other, "cccc", "one secret per name");
        }
        let reopened = EmbeddedStore::open(dir.path()).expect("reopen");
        let kept = reopened
            .fleet_secret("affinity", "dddd".into())
            .await
            .expect("secret");
        assert_eq!(kept, "aaaa");
    }

    #[tokio::test]
    async fn a_taken_domain_is_refused_and_nothing_is_stored() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = EmbeddedStore::open(dir.path()).expect("open");
        store
            .put_app(app("one", &["shared.test"]))
            .await
            .expect("put");
        let err = store
            .put_app(app("two", &["two.test", "shared.test"]))
            .await
            .expect_err("domain taken");
        assert!(matches!(err, StoreError::DomainTaken { ref owner, .. } if owner == "one"));
        assert!(store.get_app("two").await.expect("read").is_none());
        assert!(store
            .app_for_domain("two.test")
            .await
            .expect("read")
            .is_none());
    }

    #[tokio::test]
    async fn changes_name_old_and_new_domains() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = EmbeddedStore::open(dir.path()).expect("open");
        let mut changes = store.subscribe().changes;
        store
            .put_app(app("one", &["a.test", "b.test"]))
            .await
            .expect("put");
        store
            .put_app(app("one", &["b.test", "c.test"]))
            .await
            .expect("put");
        changes.recv().await.expect("first change");
        let second = changes.recv().await.expect("second change");
        let Change::App { name, mut domains } = second else {
            panic!("expected an app change, got {second:?}");
        };
        domains.sort();
        assert_eq!(name, "one");
        assert_eq!(domains, ["a.test", "b.test", "c.test"]);
        assert!(store
            .app_for_domain("a.test")
            .await
            .expect("read")
            .is_none());
        assert!(store.delete_app("one").await.expect("delete"));
        assert!(store
            .app_for_domain("b.test")
            .await
            .expect("read")
            .is_none());
        assert!(!store.delete_app("one").await.expect("delete"));
    }

    fn cert(domain: &str) -> StoredCertificate {
        let info = CertificateInfo {
            domain: domain.to_string(),
            subject: format!("CN={domain}"),
            issuer: "CN=Test".into(),
            names: vec![domain.to_string()],
            not_before: 0,
            not_after: 1,
            sha256: "00".into(),
        };
        StoredCertificate {
            domain: switchyard_model::Domain::parse(domain).expect("domain"),
            cert_pem: "CERT".into(),
            key_pem: "KEY".into(),
            info,
        }
    }

    #[tokio::test]
    async fn certificates_are_announced_listed_without_keys_and_deleted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = EmbeddedStore::open(dir.path()).expect("open");
        let mut changes = store.subscribe().changes;
        for domain in ["b.test", "*.a.test", "c.test"] {
            store.put_cert(cert(domain)).await.expect("put");
        }
        assert_eq!(
            changes.recv().await.expect("change"),
            Change::Cert {
                domain: "b.test".into()
            }
        );
        let first = store.list_certs(None, 2).await.expect("list");
        let domains: Vec<_> = first.certs.iter().map(|c| c.domain.as_str()).collect();
        assert_eq!(domains, ["*.a.test", "b.test"]);
        let rest = store
            .list_certs(first.next_after.as_deref(), 2)
            .await
            .expect("list");
        assert_eq!(rest.certs.len(), 1);
        assert!(rest.next_after.is_none());
        assert_eq!(
            store
                .get_cert("*.a.test")
                .await
                .expect("get")
                .map(|c| c.key_pem),
            Some("KEY".to_string())
        );
        assert!(store.delete_cert("b.test").await.expect("delete"));
        assert!(!store.delete_cert("b.test").await.expect("delete"));
        assert!(store.get_cert("b.test").await.expect("get").is_none());
        assert_eq!(
            store.list_certs(None, 10).await.expect("list").certs.len(),
            2
        );
    }

    fn cert_expiring(domain: &str, not_after: i64) -> StoredCertificate {
        let mut cert = cert(domain);
        cert.info.not_after = not_after;
        cert
    }

    async fn expiry_order(store: &EmbeddedStore, page: usize) -> Vec<String> {
        let mut domains = Vec::new();
        let mut after = None;
        loop {
            let got = store
                .list_certs_by_expiry(after.as_deref(), page)
                .await
                .expect("list by expiry");
            domains.extend(got.certs.into_iter().map(|c| c.domain));
            match got.next_after {
                Some(next) => after = Some(next),
                None => return domains,
            }
        }
    }

    #[tokio::test]
    async fn certificates_list_by_expiry_through_replacements_deletions_and_old_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = EmbeddedStore::open(dir.path()).expect("open");
        for (domain, not_after) in [("late.test", 300), ("soon.test", 100), ("tie-b.test", 200)] {
            store
                .put_cert(cert_expiring(domain, not_after))
                .await
                .expect("put");
        }
        store
            .put_cert(cert_expiring("tie-a.test", 200))
            .await
            .expect("put");
        assert_eq!(
            expiry_order(&store, 1).await,
            ["soon.test", "tie-a.test", "tie-b.test", "late.test"]
        );
        // Renewed: it moves to the end, and its old place is gone.
        store
            .put_cert(cert_expiring("soon.test", 400))
            .await
            .expect("renew");
        store.delete_cert("tie-b.test").await.expect("delete");
        assert_eq!(
            expiry_order(&store, 2).await,
            ["tie-a.test", "late.test", "soon.test"]
        );

        // A file whose index is missing (written before it existed) gets it on opening.
        store.release();
        {
            let db = Database::create(dir.path().join(FILE_NAME)).expect("reopen");
            let txn = db.begin_write().expect("txn");
            txn.delete_table(CERT_EXPIRY).expect("drop the index");
            txn.commit().expect("commit");
        }
        let reopened = EmbeddedStore::open(dir.path()).expect("open again");
        assert_eq!(
            expiry_order(&reopened, 10).await,
            ["tie-a.test", "late.test", "soon.test"]
        );
    }

    #[tokio::test]
    async fn listing_pages_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = EmbeddedStore::open(dir.path()).expect("open");
        for name in ["c", "a", "b"] {
            store.put_app(app(name, &[])).await.expect("put");
        }
        let first = store.list_apps(None, 2).await.expect("list");
        let names: Vec<_> = first.apps.iter().map(|a| a.name.to_string()).collect();
        assert_eq!(names, ["a", "b"]);
        let rest = store
            .list_apps(first.next_after.as_deref(), 2)
            .await
            .expect("list");
        assert_eq!(rest.apps.len(), 1);
        assert!(rest.next_after.is_none());
    }
}
