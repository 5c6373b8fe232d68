//! The issuer: on the router holding the fleet's lease, rounds over every opted-in app's
//! exact domains, ordering what is missing, expired or due for renewal, one order at a time,
//! each domain's state kept in the store. Other routers wait for the lease, ready to take
//! over when its holder stops renewing it (a crash mid-order included).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use instant_acme::{Account, AccountCredentials, ExternalAccountKey, NewAccount};
use switchyard_model::{AcmeDomain, AcmeStatus};
use switchyard_store::{acme, AcmeRecord, Store};

use crate::http_client::OpensslClient;
use crate::metrics;
use crate::order;

/// How long the lease lasts without renewal: a holder that stops (killed mid-order) is
/// replaced within this.
const LEASE_TTL: Duration = Duration::from_secs(30);
/// Longest an order may take, from the new order to the certificate.
const ORDER_TIMEOUT: Duration = Duration::from_secs(300);
/// Apps read per store call while collecting the wanted domains.
const APPS_PAGE: usize = 1000;
/// After a change to the apps, how long to let more arrive before a round.
const SETTLE: Duration = Duration::from_millis(200);
/// Let's Encrypt's limit of new orders per account per three hours, kept locally so a
/// burst of new apps waits its turn instead of being refused by the CA.
const ORDERS_PER_WINDOW: usize = 300;
const ORDER_WINDOW: Duration = Duration::from_secs(3 * 3600);

/// How the router talks to its ACME CA.
#[derive(Debug, Clone)]
pub struct AcmeSettings {
    /// The CA's directory URL.
    pub directory: String,
    /// Contact address for the account.
    pub email: Option<String>,
    /// External account binding: key id and HMAC key (raw bytes).
    pub eab: Option<(String, Vec<u8>)>,
    /// A CA certificate to trust for the directory (a private ACME server).
    pub ca_file: Option<PathBuf>,
    /// How often the lease holder looks for domains to order when nothing changes.
    pub check_interval: Duration,
}

/// The fleet's certificate issuer, on one router.
pub struct Issuer {
    settings: AcmeSettings,
    store: Arc<dyn Store>,
    client: OpensslClient,
    /// Who this router is in the lease.
    holder: String,
    account: Option<Account>,
    /// When this router's recent orders started, for the CA's order limit.
    recent_orders: VecDeque<Instant>,
}

impl Issuer {
    /// An issuer for `settings` on `store`; refused when the CA file cannot be read.
    pub fn new(settings: AcmeSettings, store: Arc<dyn Store>) -> Result<Self, String> {
        let client = OpensslClient::new(settings.ca_file.as_deref())?;
        metrics::register_all();
        let holder = format!(
            "{}-{}-{:08x}",
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "router".into()),
            std::process::id(),
            rand::random::<u32>()
        );
        Ok(Self {
            settings,
            store,
            client,
            holder,
            account: None,
            recent_orders: VecDeque::new(),
        })
    }

    /// Runs rounds until `stop` resolves, then gives the lease up.
    pub async fn run(mut self, stop: impl std::future::Future<Output = ()>) {
        log::info!(
            "acme: issuing from {} as {}",
            self.settings.directory,
            self.holder
        );
        let mut changes = self.store.subscribe().changes;
        tokio::pin!(stop);
        loop {
            self.round().await;
            tokio::select! {
                () = &mut stop => break,
                () = tokio::time::sleep(self.settings.check_interval) => {}
                // A new app or domain is ordered for at once, not at the next interval.
                _ = changes.recv() => tokio::time::sleep(SETTLE).await,
            }
        }
        if let Err(e) = self.store.acme_release(&self.holder).await {
            log::debug!("acme: could not release the lease: {e}");
        }
        metrics::LEASE_HELD.set(0);
    }

    async fn round(&mut self) {
        if !self.holds_lease().await {
            return;
        }
        let wanted = match self.wanted_domains().await {
            Ok(wanted) => wanted,
            Err(e) => {
                log::warn!("acme: cannot read the apps: {e}");
                return;
            }
        };
        let mut by_status: HashMap<AcmeStatus, i64> = HashMap::new();
        let mut soonest_expiry = None::<i64>;
        for domain in &wanted {
            let Some(state) = self.step(domain).await else {
                continue;
            };
            *by_status.entry(state.status).or_default() += 1;
            if state.status == AcmeStatus::Issued {
                soonest_expiry = soonest_expiry
                    .min(state.not_after_unix)
                    .or(state.not_after_unix);
            }
            if !self.holds_lease().await {
                return;
            }
        }
        self.forget_unwanted(&wanted).await;
        for status in AcmeStatus::ALL {
            metrics::DOMAINS
                .with_label_values(&[status.label()])
                .set(by_status.get(&status).copied().unwrap_or(0));
        }
        if let Some(not_after) = soonest_expiry {
            metrics::SOONEST_EXPIRY_DAYS.set((not_after - unix_now()) as f64 / 86_400.0);
        }
    }

    /// Takes or extends the lease; false while another router holds it (or the store is
    /// away), and then this router orders nothing.
    async fn holds_lease(&self) -> bool {
        let held = match self.store.acme_lease(&self.holder, LEASE_TTL).await {
            Ok(token) => token.is_some(),
            Err(e) => {
                log::warn!("acme: cannot reach the store for the lease: {e}");
                false
            }
        };
        metrics::LEASE_HELD.set(i64::from(held));
        held
    }

    /// Every exact domain and wildcard of the apps that opted in.
    async fn wanted_domains(&self) -> Result<BTreeSet<String>, switchyard_store::StoreError> {
        let mut wanted = BTreeSet::new();
        let mut after = None;
        loop {
            let page = self.store.list_apps(after.as_deref(), APPS_PAGE).await?;
            for app in page.apps.iter().filter(|app| app.tls.acme) {
                wanted.extend(app.domains.iter().map(ToString::to_string));
            }
            match page.next_after {
                Some(next) => after = Some(next),
                None => return Ok(wanted),
            }
        }
    }

    /// Moves one domain on: orders when it is due, records the outcome. The domain's state
    /// afterwards, or `None` when it is not the issuer's to handle (a valid upload) or the
    /// store could not be read.
    async fn step(&mut self, domain: &str) -> Option<AcmeDomain> {
        let now = unix_now();
        let store = self.store.clone();
        let mut state = match acme::domain(store.as_ref(), domain).await {
            Ok(state) => state.unwrap_or_else(|| AcmeDomain::pending(domain, now)),
            Err(e) => {
                log::warn!("acme: cannot read the state of {domain}: {e}");
                return None;
            }
        };
        if domain.starts_with("*.") {
            if state.status != AcmeStatus::Unsupported {
                state.status = AcmeStatus::Unsupported;
                state.reason = Some(
                    "a wildcard needs a DNS-01 challenge, which this router does not answer; \
                     upload its certificate"
                        .into(),
                );
                state.updated_unix = now;
                self.save(&state).await;
            }
            return Some(state);
        }
        let stored = match store.get_cert(domain).await {
            Ok(stored) => stored,
            Err(e) => {
                log::warn!("acme: cannot read the certificate of {domain}: {e}");
                return None;
            }
        };
        match &stored {
            // An uploaded certificate wins while it is valid.
            Some(cert)
                if state.sha256.as_deref() != Some(cert.info.sha256.as_str())
                    && cert.info.not_after > now =>
            {
                return None
            }
            // The certificate it issued was deleted: order again.
            None if state.status == AcmeStatus::Issued => state.status = AcmeStatus::Pending,
            _ => {}
        }
        if !state.due(now) {
            return Some(state);
        }
        if !self.may_order() {
            metrics::ORDERS.with_label_values(&["deferred"]).inc();
            return Some(state);
        }
        if !self.holds_lease().await {
            return None;
        }
        state.status = AcmeStatus::Validating;
        state.updated_unix = now;
        self.save(&state).await;
        self.recent_orders.push_back(Instant::now());
        let outcome = match self.account().await {
            Ok(account) => tokio::time::timeout(
                ORDER_TIMEOUT,
                order::certificate_for(&account, store.as_ref(), domain),
            )
            .await
            .unwrap_or_else(|_| Err(format!("the order took longer than {ORDER_TIMEOUT:?}"))),
            Err(reason) => Err(reason),
        };
        let now = unix_now();
        match outcome {
            Ok(cert) => {
                // Fenced: a router that lost the lease mid-order stores nothing.
                if !self.holds_lease().await {
                    log::warn!("acme: lost the lease while ordering {domain}; not storing it");
                    return None;
                }
                let info = cert.info.clone();
                match store.put_cert(cert).await {
                    Ok(_) => {
                        state.issued(
                            info.issuer,
                            info.sha256,
                            info.not_before,
                            info.not_after,
                            now,
                        );
                        metrics::ORDERS.with_label_values(&["issued"]).inc();
                        log::info!(
                            "acme: issued a certificate for {domain}, valid until {}",
                            info.not_after
                        );
                    }
                    Err(e) => state.failed(format!("storing the certificate: {e}"), now),
                }
            }
            Err(reason) => {
                log::warn!("acme: the order for {domain} failed: {reason}");
                metrics::ORDERS.with_label_values(&["failed"]).inc();
                state.failed(reason, now);
            }
        }
        self.save(&state).await;
        Some(state)
    }

    /// Whether the CA's order limit leaves room for one more order now.
    fn may_order(&mut self) -> bool {
        while self
            .recent_orders
            .front()
            .is_some_and(|started| started.elapsed() > ORDER_WINDOW)
        {
            self.recent_orders.pop_front();
        }
        self.recent_orders.len() < ORDERS_PER_WINDOW
    }

    async fn save(&self, state: &AcmeDomain) {
        if let Err(e) = acme::put_domain(self.store.as_ref(), state).await {
            log::warn!("acme: cannot store the state of {}: {e}", state.domain);
        }
    }

    /// Domains no opted-in app lists any more stop being renewed: their records go.
    async fn forget_unwanted(&self, wanted: &BTreeSet<String>) {
        let mut after: Option<String> = None;
        loop {
            let (states, next) =
                match acme::domains(self.store.as_ref(), after.as_deref(), APPS_PAGE).await {
                    Ok(page) => page,
                    Err(e) => {
                        log::warn!("acme: cannot list domain states: {e}");
                        return;
                    }
                };
            for state in states.iter().filter(|s| !wanted.contains(&s.domain)) {
                log::info!(
                    "acme: {} is no longer wanted; it will not be renewed",
                    state.domain
                );
                if let Err(e) = self
                    .store
                    .acme_delete(AcmeRecord::Domain(&state.domain))
                    .await
                {
                    log::warn!("acme: cannot forget {}: {e}", state.domain);
                }
            }
            match next {
                Some(next) => after = Some(next),
                None => return,
            }
        }
    }

    /// The fleet's account at the CA: read from the store, or created once (by the lease
    /// holder) and stored for every router after it.
    async fn account(&mut self) -> Result<Account, String> {
        if let Some(account) = &self.account {
            return Ok(account.clone());
        }
        let record = AcmeRecord::Account(&self.settings.directory);
        let stored = self
            .store
            .acme_get(record)
            .await
            .map_err(|e| format!("reading the account: {e}"))?;
        let builder = Account::builder_with_http(Box::new(self.client.clone()));
        let account = match stored {
            Some(json) => {
                let credentials: AccountCredentials = serde_json::from_str(&json)
                    .map_err(|e| format!("the stored account is unreadable: {e}"))?;
                builder
                    .from_credentials(credentials)
                    .await
                    .map_err(|e| format!("loading the account: {e}"))?
            }
            None => {
                let contact = self.settings.email.as_ref().map(|e| format!("mailto:{e}"));
                let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
                let eab = self
                    .settings
                    .eab
                    .as_ref()
                    .map(|(id, key)| ExternalAccountKey::new(id.clone(), key));
                let (account, credentials) = builder
                    .create(
                        &NewAccount {
                            contact: &contacts,
                            terms_of_service_agreed: true,
                            only_return_existing: false,
                        },
                        self.settings.directory.clone(),
                        eab.as_ref(),
                    )
                    .await
                    .map_err(|e| format!("creating the account: {e}"))?;
                let json = serde_json::to_string(&credentials)
                    .map_err(|e| format!("encoding the account: {e}"))?;
                self.store
                    .acme_put(record, json, None)
                    .await
                    .map_err(|e| format!("storing the account: {e}"))?;
                log::info!(
                    "acme: created the fleet's account at {}",
                    self.settings.directory
                );
                account
            }
        };
        self.account = Some(account.clone());
        Ok(account)
    }
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}
