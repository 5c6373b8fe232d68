//! Server name → certificate, parsed lazily on the first handshake that needs it and kept in a
//! bounded in-process cache: a router with a hundred thousand certificates never loads them
//! all at start-up. A change
//! event invalidates exactly the name it carries. Names with no certificate are remembered
//! briefly in a separate, larger cache, so a flood of unknown SNI names neither reaches the
//! store for each handshake nor evicts the certificates that are in use.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openssl::pkey::{PKey, Private};
use openssl::x509::X509;
use quick_cache::sync::Cache;
use switchyard_model::{Change, Domain, StoredCertificate};
use switchyard_store::{Store, StoreError};

use crate::metrics;
use crate::tls::name_index::NameIndex;

/// A certificate ready to hand to OpenSSL.
pub struct ServedCert {
    /// The leaf.
    pub leaf: X509,
    /// Intermediates, in order.
    pub chain: Vec<X509>,
    /// The leaf's key.
    pub key: PKey<Private>,
    /// Fingerprint of the leaf, to revalidate against the store without re-parsing.
    pub sha256: String,
}

impl ServedCert {
    /// Parses a PEM chain and key (a certificate file given in the configuration, or one read
    /// back from the store).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, String> {
        let mut certs = X509::stack_from_pem(cert_pem.as_bytes())
            .map_err(|e| format!("the certificate chain does not parse: {e}"))?
            .into_iter();
        let leaf = certs
            .next()
            .ok_or_else(|| "the certificate file holds no certificate".to_string())?;
        let key = PKey::private_key_from_pem(key_pem.as_bytes())
            .map_err(|e| format!("the private key does not parse: {e}"))?;
        let matches = leaf
            .public_key()
            .map(|p| p.public_eq(&key))
            .unwrap_or(false);
        if !matches {
            return Err("the private key does not match the certificate".into());
        }
        let sha256 = leaf
            .digest(openssl::hash::MessageDigest::sha256())
            .map(|d| d.iter().map(|b| format!("{b:02x}")).collect())
            .map_err(|e| format!("cannot fingerprint the certificate: {e}"))?;
        Ok(Self {
            leaf,
            chain: certs.collect(),
            key,
            sha256,
        })
    }
}

/// Sizes and lifetimes of the certificate cache.
#[derive(Debug, Clone, Copy)]
pub struct CertCacheLimits {
    /// Most parsed certificates kept.
    pub certificates: usize,
    /// Most names remembered as having no certificate.
    pub absent_names: usize,
    /// How long "no certificate" is believed without a change event.
    pub absent_ttl: Duration,
}

impl Default for CertCacheLimits {
    fn default() -> Self {
        Self {
            certificates: 10_000,
            absent_names: 100_000,
            absent_ttl: Duration::from_secs(10),
        }
    }
}

/// What a handshake is served.
pub enum Selected {
    /// The certificate stored for the name or its wildcard.
    Stored(Arc<ServedCert>),
    /// No stored certificate matched: the configured default.
    Default(Arc<ServedCert>),
    /// Nothing to serve: the handshake fails.
    Nothing,
}

/// The in-process certificate view over the store.
pub struct CertCache {
    store: Arc<dyn Store>,
    found: Cache<String, Arc<ServedCert>>,
    absent: Cache<String, Instant>,
    default: Option<Arc<ServedCert>>,
    absent_ttl: Duration,
    /// Most parsed certificates kept (`found`'s size).
    capacity: usize,
    /// Set by [`warm`](Self::warm): a changed certificate is loaded again at once.
    kept_warm: AtomicBool,
    /// Every name the store holds a certificate under, once [`warm`](Self::warm) has read
    /// them all, kept by the changes since (and those during the read). With it, a name
    /// that is neither there nor in memory is known to have no certificate without asking
    /// the store.
    stored_names: NameIndex,
    /// Bumped by every invalidation; a fill that read the store before the bump is not kept,
    /// so a certificate replaced during a cold handshake is never cached in its old version.
    generation: AtomicU64,
}

impl CertCache {
    /// A cache over `store`, serving `default` to names without a certificate of their own.
    pub fn new(
        store: Arc<dyn Store>,
        limits: CertCacheLimits,
        default: Option<ServedCert>,
    ) -> Self {
        metrics::register_all();
        Self {
            store,
            found: Cache::new(limits.certificates.max(1)),
            absent: Cache::new(limits.absent_names.max(1)),
            default: default.map(Arc::new),
            absent_ttl: limits.absent_ttl,
            capacity: limits.certificates.max(1),
            kept_warm: AtomicBool::new(false),
            stored_names: NameIndex::default(),
            generation: AtomicU64::new(0),
        }
    }

    /// The certificate for a TLS server name: exact name, then its one-label wildcard, then
    /// the default. A missing, malformed or IP-literal name gets the default.
    pub async fn select(&self, server_name: Option<&str>) -> Result<Selected, StoreError> {
        let name = server_name.and_then(|n| Domain::parse(n).ok());
        if let Some(name) = name.filter(|n| !n.is_wildcard()) {
            if let Some(cert) = self.lookup(name.as_str()).await? {
                return Ok(Selected::Stored(cert));
            }
            if let Some(wildcard) = wildcard_of(name.as_str()) {
                if let Some(cert) = self.lookup(&wildcard).await? {
                    return Ok(Selected::Stored(cert));
                }
            }
        }
        Ok(match &self.default {
            Some(cert) => Selected::Default(cert.clone()),
            None => Selected::Nothing,
        })
    }

    /// What [`select`](Self::select) would answer from memory alone, for handshakes that
    /// cannot wait (QUIC's, whose TLS chooses the certificate in a callback): `None` when
    /// the name (or its wildcard) was never looked up, whereupon a lookup is started on
    /// the current runtime so the client's next attempt finds it.
    pub fn select_cached(self: &Arc<Self>, server_name: Option<&str>) -> Option<Selected> {
        let name = server_name.and_then(|n| Domain::parse(n).ok());
        if let Some(name) = name.filter(|n| !n.is_wildcard()) {
            let wildcard = wildcard_of(name.as_str());
            let keys = std::iter::once(name.as_str().to_string()).chain(wildcard.clone());
            // A name found absent before is served the default at once, and looked up again
            // in the background once that finding is older than its TTL.
            let (mut all_known, mut all_current) = (true, true);
            for key in keys {
                if let Some(cert) = self.found.get(&key) {
                    metrics::CERT_CACHE_HITS.inc();
                    return Some(Selected::Stored(cert));
                }
                let until = self.absent.get(&key);
                all_known &= until.is_some();
                all_current &= until.is_some_and(|u| u > Instant::now());
            }
            if !all_known
                && self
                    .stored_names
                    .knows_unstored(name.as_str(), wildcard.as_deref())
            {
                all_known = true;
                all_current = true;
            }
            if !all_current {
                let (cache, name) = (self.clone(), name.as_str().to_string());
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move {
                        if let Err(e) = cache.select(Some(&name)).await {
                            log::warn!("certificate for {name} not loaded: {e}");
                        }
                    });
                }
                if !all_known {
                    return None;
                }
            }
        }
        Some(match &self.default {
            Some(cert) => Selected::Default(cert.clone()),
            None => Selected::Nothing,
        })
    }

    /// Loads stored certificates into memory, up to the cache's size, in the store's
    /// order of names: for QUIC's handshakes, which cannot wait for the store (see
    /// [`select_cached`](Self::select_cached)), so that a router just started (or taking
    /// over from another) fails no client's first HTTP/3 connection. How many were loaded.
    pub async fn warm(&self) -> Result<usize, StoreError> {
        const PAGE: usize = 500;
        self.kept_warm.store(true, Ordering::Relaxed);
        // Changes from here on are noted by the index and applied on top of this read; a
        // read that fails or is given up on (dropped) leaves no index.
        let mut read = self.stored_names.begin_read();
        let mut loaded = 0;
        let mut after = None;
        loop {
            let page = self.store.list_certs(after.as_deref(), PAGE).await?;
            for info in &page.certs {
                read.listed(&info.domain);
                if loaded < self.capacity && self.lookup(&info.domain).await?.is_some() {
                    loaded += 1;
                }
            }
            match page.next_after {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        read.finish();
        Ok(loaded)
    }

    /// The certificate stored under exactly `key`, from memory or the store.
    async fn lookup(&self, key: &str) -> Result<Option<Arc<ServedCert>>, StoreError> {
        if let Some(until) = self.absent.get(key) {
            if until > Instant::now() {
                metrics::CERT_CACHE_HITS.inc();
                return Ok(None);
            }
            // Kept while the store is asked again: a QUIC handshake meanwhile is served
            // the default rather than failed (`select_cached`).
        }
        let guard = match self.found.get_value_or_guard_async(key).await {
            Ok(cert) => {
                metrics::CERT_CACHE_HITS.inc();
                return Ok(Some(cert));
            }
            Err(guard) => guard,
        };
        // Concurrent handshakes for the same cold name wait on this guard: one store read
        // and one parse serve them all.
        metrics::CERT_CACHE_MISSES.inc();
        let generation = self.generation.load(Ordering::Acquire);
        let stored = self.store.get_cert(key).await?;
        let parsed = stored.and_then(|stored| parse_stored(&stored));
        let current = self.generation.load(Ordering::Acquire) == generation;
        let result = match parsed {
            Some(cert) => {
                let cert = Arc::new(cert);
                if current {
                    let _ = guard.insert(cert.clone());
                }
                self.absent.remove(key);
                Some(cert)
            }
            None => {
                drop(guard);
                if current {
                    self.absent
                        .insert(key.to_string(), Instant::now() + self.absent_ttl);
                }
                None
            }
        };
        self.publish_size();
        Ok(result)
    }

    /// Applies a change from the store: a certificate change evicts exactly its name.
    pub async fn apply(&self, change: &Change) {
        match change {
            Change::Cert { domain } => {
                self.invalidate(domain);
                if self.kept_warm.load(Ordering::Relaxed) {
                    // The new version in memory before QUIC's next handshake asks for it.
                    match self.lookup(domain).await {
                        Ok(found) => self.stored_names.note(domain, found.is_some()),
                        Err(e) => {
                            self.stored_names.forget();
                            log::warn!("certificate for {domain} not reloaded: {e}");
                        }
                    }
                }
            }
            Change::Resync => {
                self.revalidate().await;
                if self.kept_warm.load(Ordering::Relaxed) {
                    // Changes were missed: the index is read again from the store.
                    self.stored_names.forget();
                    if let Err(e) = self.warm().await {
                        log::warn!("certificates not read again after missed changes: {e}");
                    }
                }
            }
            Change::App { .. }
            | Change::CachePurge { .. }
            | Change::WafReload { .. }
            | Change::Filter { .. } => {}
        }
        self.publish_size();
    }

    fn invalidate(&self, key: &str) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.found.remove(key);
        self.absent.remove(key);
    }

    /// After missed events: keep each cached certificate whose stored fingerprint is
    /// unchanged, so handshakes keep hitting the cache instead of all parsing again.
    async fn revalidate(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.absent.clear();
        let keys: Vec<(String, String)> = self
            .found
            .iter()
            .map(|(key, cert)| (key, cert.sha256.clone()))
            .collect();
        for (key, sha256) in keys {
            match self.store.get_cert(&key).await {
                Ok(Some(stored)) if stored.info.sha256 == sha256 => {}
                Ok(_) => {
                    self.found.remove(&key);
                }
                Err(e) => {
                    // The store is away again: serving the certificates we have beats
                    // failing handshakes; the next reconnection revalidates again.
                    log::warn!("certificate revalidation interrupted, cache kept: {e}");
                    return;
                }
            }
        }
    }

    fn publish_size(&self) {
        metrics::CERT_CACHE_ENTRIES.set((self.found.len() + self.absent.len()) as i64);
    }
}

fn parse_stored(stored: &StoredCertificate) -> Option<ServedCert> {
    match ServedCert::from_pem(&stored.cert_pem, &stored.key_pem) {
        Ok(cert) => Some(cert),
        Err(e) => {
            // The API validated it on the way in; only a hand-edited store gets here.
            log::error!(
                "stored certificate for '{}' is unusable: {e}",
                stored.domain
            );
            None
        }
    }
}

/// `a.example.com` → `*.example.com`; nothing for names whose parent has a single label.
fn wildcard_of(name: &str) -> Option<String> {
    let (_, parent) = name.split_once('.')?;
    parent.contains('.').then(|| format!("*.{parent}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_replace_exactly_one_label() {
        assert_eq!(
            wildcard_of("a.example.com").as_deref(),
            Some("*.example.com")
        );
        assert_eq!(
            wildcard_of("a.b.example.com").as_deref(),
            Some("*.b.example.com")
        );
        assert_eq!(wildcard_of("example.com"), None);
        assert_eq!(wildcard_of("localhost"), None);
    }
}
