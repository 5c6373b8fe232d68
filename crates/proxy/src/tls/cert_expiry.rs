//! Counts stored certificates and those expiring soon, for alerting. It walks the store's
//! small certificate descriptions page by page (never keys, never parsing PEM), so a scan
//! of 100,000 certificates is cheap and start-up does not wait for it.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::shutdown::ShutdownWatch;
use switchyard_store::{Store, StoreError};

use crate::metrics;

/// A certificate expiring within this window counts as expiring soon.
pub(crate) const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 86_400);
const PAGE: usize = 1000;

/// Exports the end of validity of the certificate served to names without one of their own
/// (`--default-cert`), which no store scan sees: a file on disk renewed by hand or by a
/// tool of the operator's, the one most easily forgotten.
pub fn watch_default_cert(cert: &crate::ServedCert) {
    match switchyard_model::unix_seconds(cert.leaf.not_after()) {
        Some(not_after) => metrics::DEFAULT_CERT_EXPIRY.set(not_after as f64),
        None => log::warn!("the default certificate's end of validity cannot be read"),
    }
}

/// The periodic expiry scan.
pub struct CertExpiryScan {
    store: Arc<dyn Store>,
    interval: Duration,
}

impl CertExpiryScan {
    /// A scan of `store` every `interval`, the first one at start-up.
    pub fn new(store: Arc<dyn Store>, interval: Duration) -> Self {
        Self { store, interval }
    }

    async fn scan(&self) -> Result<(i64, i64), StoreError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let horizon = now + EXPIRY_WARNING.as_secs() as i64;
        let (mut stored, mut expiring) = (0, 0);
        let mut after: Option<String> = None;
        loop {
            let page = self.store.list_certs(after.as_deref(), PAGE).await?;
            stored += page.certs.len() as i64;
            expiring += page.certs.iter().filter(|c| c.not_after <= horizon).count() as i64;
            match page.next_after {
                Some(next) => after = Some(next),
                None => return Ok((stored, expiring)),
            }
            // Let handshakes and requests on this thread run between pages.
            tokio::task::yield_now().await;
        }
    }

    /// Runs until `shutdown` changes.
    pub async fn run(&self, mut shutdown: ShutdownWatch) {
        let mut ticks = tokio::time::interval(self.interval);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = shutdown.changed() => return,
            }
            match self.scan().await {
                Ok((stored, expiring)) => {
                    metrics::CERTS_STORED.set(stored);
                    metrics::CERTS_EXPIRING_SOON.set(expiring);
                    if expiring > 0 {
                        log::warn!(
                            "{expiring} of {stored} stored certificates expire within 14 days"
                        );
                    }
                }
                Err(e) => log::warn!("certificate expiry scan failed: {e}"),
            }
        }
    }
}
