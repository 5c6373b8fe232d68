//! The issuer: on the router holding the fleet's lease, rounds over every opted-in app's
//! exact domains, ordering what is missing, expired or due for renewal, one order at a time,
//! each domain's state kept in the store. Other routers wait for the lease, ready to take
//! over when its holder stops renewing it (a crash mid-order included).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use instant_acme::{Account, AccountCredentials, ExternalAccountKey, NewAccount};
use switchyard_model::{AcmeDomain, AcmeStatus, Change};
use switchyard_store::{acme, AcmeRecord, Store};

use crate::ari;
use crate::http_client::OpensslClient;
use crate::metrics;
use crate::order;

/// How long the lease lasts without renewal: a holder that stops (killed mid-order) is
/// replaced within this.
const LEASE_TTL: Duration = Duration::from_secs(30);
/// Longest an order may take, from the new order to the certificate.
const ORDER_TIMEOUT: Duration = Duration::from_secs(300);
/// Orders in flight at once: the CA's validations and issuance are waits, not work, so a
/// thousand new domains take minutes, not a quarter of an hour.
const ORDERS_AT_ONCE: usize = 8;
/// Apps read per store call while collecting the wanted domains.
const APPS_PAGE: usize = 1000;
/// After a change to the apps, how long to let more arrive before a round.
const SETTLE: Duration = Duration::from_millis(200);
/// Let's Encrypt's limit of new orders per account per three hours, the default of
/// `AcmeSettings::orders_per_3h`: kept locally so a burst of new apps waits its turn
/// instead of being refused by the CA.
pub const LETS_ENCRYPT_ORDERS_PER_3H: usize = 300;
const ORDER_WINDOW: Duration = Duration::from_secs(3 * 3600);

/// Let's Encrypt's limit of certificates per registered domain per week, kept locally.
const CERTIFICATES_PER_REGISTERED_DOMAIN: usize = 50;
const REGISTERED_DOMAIN_WINDOW: Duration = Duration::from_secs(7 * 86_400);

/// When this router's recent orders started: all of them, and by registered domain.
#[derive(Debug, Default)]
struct CaLimits {
    orders: VecDeque<Instant>,
    by_registered_domain: HashMap<String, VecDeque<Instant>>,
}

/// The registered domain (the public suffix and one label) of `domain`: `shop.example.co.uk`
/// → `example.co.uk`; a name under no known suffix counts as itself.
fn registered_domain(domain: &str) -> String {
    psl::domain_str(domain).unwrap_or(domain).to_string()
}

/// How many of `times` fall within `window` before `now`, the older ones dropped.
fn within(times: &mut VecDeque<Instant>, now: Instant, window: Duration) -> usize {
    while times
        .front()
        .is_some_and(|at| now.duration_since(*at) > window)
    {
        times.pop_front();
    }
    times.len()
}

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
    /// Most new orders per three hours (the CA's limit for one account).
    pub orders_per_3h: usize,
    /// How the fleet proves it controls a domain.
    pub challenge: ChallengeKind,
}

/// The challenge the issuer answers; every router of the fleet serves its answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChallengeKind {
    /// HTTP-01, on the plain HTTP listener (the CA connects to port 80).
    Http01,
    /// TLS-ALPN-01 (RFC 8737), on the HTTPS listener (port 443): for fleets whose port 80
    /// is closed.
    TlsAlpn01,
}

/// The fleet's certificate issuer, on one router.
pub struct Issuer {
    settings: AcmeSettings,
    store: Arc<dyn Store>,
    client: OpensslClient,
    /// Who this router is in the lease.
    holder: String,
    account: tokio::sync::Mutex<Option<Account>>,
    /// The CA's limits across domains, counted by this router while it holds the lease.
    limits: std::sync::Mutex<CaLimits>,
    /// The CA's directory offers no renewal information (ARI): not asked again.
    ari_unsupported: std::sync::atomic::AtomicBool,
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
            account: tokio::sync::Mutex::new(None),
            limits: std::sync::Mutex::default(),
            ari_unsupported: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Runs rounds until `stop` resolves, then gives the lease up.
    ///
    /// The lease is taken or renewed every tick (a third of its life, or the check interval
    /// when shorter); a router that just took it runs a full round at once (a holder that
    /// died mid-order is taken over), the holder another every check interval. A change to
    /// an app runs a round over that app's domains only, so a busy fleet's deploys cost a
    /// few store reads each, not a walk over every domain.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        log::info!(
            "acme: issuing from {} as {}",
            self.settings.directory,
            self.holder
        );
        let mut changes = self.store.subscribe().changes;
        let mut lease_tick =
            tokio::time::interval((LEASE_TTL / 3).min(self.settings.check_interval));
        lease_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut held = false;
        let mut next_full_round = Instant::now();
        // The store keeps its feed for the process's life; should it end, rounds go on by
        // the clock alone.
        let mut following = true;
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => break,
                _ = lease_tick.tick() => {
                    let holds = self.holds_lease().await;
                    if holds && (!held || Instant::now() >= next_full_round) {
                        self.full_round().await;
                        next_full_round = Instant::now() + self.settings.check_interval;
                    }
                    held = holds;
                }
                change = changes.recv(), if following => {
                    if matches!(change, Err(tokio::sync::broadcast::error::RecvError::Closed)) {
                        following = false;
                        continue;
                    }
                    let mut apps = BTreeSet::new();
                    let mut everything = !note_change(change, &mut apps);
                    tokio::time::sleep(SETTLE).await;
                    loop {
                        match changes.try_recv() {
                            Err(tokio::sync::broadcast::error::TryRecvError::Empty) => break,
                            change => everything |= !note_change(change.map_err(|_| {
                                tokio::sync::broadcast::error::RecvError::Lagged(0)
                            }), &mut apps),
                        }
                    }
                    if !self.holds_lease().await {
                        held = false;
                        continue;
                    }
                    held = true;
                    if everything {
                        self.full_round().await;
                    } else {
                        self.round_for_apps(&apps).await;
                    }
                }
            }
        }
        if let Err(e) = self.store.acme_release(&self.holder).await {
            log::debug!("acme: could not release the lease: {e}");
        }
        metrics::LEASE_HELD.set(0);
        metrics::SOONEST_EXPIRY_DAYS.forget();
    }

    /// Every opted-in domain: what is due is ordered, what no app lists is forgotten, and
    /// the per-state metrics are counted.
    async fn full_round(&self) {
        let wanted = match self.wanted_domains().await {
            Ok(wanted) => wanted,
            Err(e) => {
                log::warn!("acme: cannot read the apps: {e}");
                return;
            }
        };
        let mut by_status: HashMap<AcmeStatus, i64> = HashMap::new();
        let mut soonest_expiry = None::<i64>;
        let mut steps = self.steps(wanted.iter().cloned().collect());
        while let Some(state) = steps.next().await {
            let Some(state) = state else {
                continue;
            };
            *by_status.entry(state.status).or_default() += 1;
            if let (AcmeStatus::Issued, Some(not_after)) = (state.status, state.not_after_unix) {
                soonest_expiry = Some(soonest_expiry.map_or(not_after, |s| s.min(not_after)));
            }
        }
        self.forget_unwanted(&wanted).await;
        for status in AcmeStatus::ALL {
            metrics::DOMAINS
                .with_label_values(&[status.label()])
                .set(by_status.get(&status).copied().unwrap_or(0));
        }
        match soonest_expiry {
            Some(not_after) => {
                metrics::SOONEST_EXPIRY_DAYS.set((not_after - unix_now()) as f64 / 86_400.0);
            }
            None => metrics::SOONEST_EXPIRY_DAYS.forget(),
        }
    }

    /// The domains of the apps named (those that opted in).
    async fn round_for_apps(&self, apps: &BTreeSet<String>) {
        let mut domains = Vec::new();
        for name in apps {
            match self.store.get_app(name).await {
                Ok(Some(app)) if app.tls.acme => {
                    domains.extend(app.domains.iter().map(ToString::to_string));
                }
                Ok(_) => {}
                Err(e) => log::warn!("acme: cannot read app {name}: {e}"),
            }
        }
        self.steps(domains).for_each(|_| async {}).await;
    }

    /// `step` over `domains`, [`ORDERS_AT_ONCE`] at a time, their states as they end.
    fn steps(
        &self,
        domains: Vec<String>,
    ) -> impl futures_util::Stream<Item = Option<AcmeDomain>> + Send + '_ {
        futures_util::stream::iter(domains)
            .map(move |domain| async move { self.step(&domain).await })
            .buffer_unordered(ORDERS_AT_ONCE)
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
        if !held {
            // Another router counts the fleet's certificates now: its figure is the one.
            metrics::SOONEST_EXPIRY_DAYS.forget();
        }
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
    async fn step(&self, domain: &str) -> Option<AcmeDomain> {
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
            if let Some(cert) = stored.as_ref().filter(|_| state.ari_due(now)) {
                self.consult_ari(&mut state, &cert.cert_pem, now).await;
            }
            if !state.due(now) {
                return Some(state);
            }
        }
        if let Err(limit) = self.may_order(domain) {
            metrics::ORDERS.with_label_values(&["deferred"]).inc();
            if state.reason.as_deref() != Some(limit) {
                state.reason = Some(limit.to_string());
                state.updated_unix = now;
                self.save(&state).await;
            }
            return Some(state);
        }
        if !self.holds_lease().await {
            return None;
        }
        state.status = AcmeStatus::Validating;
        state.updated_unix = now;
        self.save(&state).await;
        let outcome = match self.account().await {
            Ok(account) => tokio::time::timeout(
                ORDER_TIMEOUT,
                order::certificate_for(&account, store.as_ref(), domain, self.settings.challenge),
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

    /// Asks the CA for the certificate's renewal window (ARI, when it offers it), which
    /// moves the renewal sooner when the window opens before two thirds of the lifetime.
    async fn consult_ari(&self, state: &mut AcmeDomain, cert_pem: &str, now: i64) {
        if self
            .ari_unsupported
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        let Ok(account) = self.account().await else {
            return;
        };
        match ari::window(&account, cert_pem).await {
            Ok(Some((start, end))) => {
                // A random point in the window, as RFC 9773 asks, so a fleet's renewals
                // do not all land on its first second.
                let pick = start + (rand::random::<u64>() % (end - start).max(1) as u64) as i64;
                state.consider_renewal_window(start, end, pick, now);
                self.save(state).await;
            }
            Ok(None) => {
                log::info!("acme: the CA offers no renewal information; renewing at two thirds");
                self.ari_unsupported
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
            Err(e) => log::info!("acme: {}: {e}", state.domain),
        }
    }

    /// Counts an order for `domain` against the CA's limits kept here: new orders per
    /// account per three hours, certificates per registered domain (by the Public Suffix
    /// List) per week. Nothing is counted when a limit leaves no room; the error says which.
    fn may_order(&self, domain: &str) -> Result<(), &'static str> {
        let mut limits = self
            .limits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        if within(&mut limits.orders, now, ORDER_WINDOW) >= self.settings.orders_per_3h {
            return Err("waiting: the CA's limit of new orders per 3 hours");
        }
        let registered = registered_domain(domain);
        let issued = limits.by_registered_domain.entry(registered).or_default();
        if within(issued, now, REGISTERED_DOMAIN_WINDOW) >= CERTIFICATES_PER_REGISTERED_DOMAIN {
            return Err("waiting: the CA's limit of certificates per registered domain per week");
        }
        issued.push_back(now);
        limits.orders.push_back(now);
        // Registered domains with nothing in their window are forgotten: the map holds
        // at most the registered domains ordered for this week.
        limits
            .by_registered_domain
            .retain(|_, times| !times.is_empty());
        Ok(())
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
    async fn account(&self) -> Result<Account, String> {
        // Held while the account is loaded or created: orders running at once share one.
        let mut cached = self.account.lock().await;
        if let Some(account) = cached.as_ref() {
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
        *cached = Some(account.clone());
        Ok(account)
    }
}

/// Notes the app a change names; false when every domain must be looked at (events were
/// missed or the store says to resync).
fn note_change(
    change: Result<Change, tokio::sync::broadcast::error::RecvError>,
    apps: &mut BTreeSet<String>,
) -> bool {
    match change {
        Ok(Change::App { name, .. }) => {
            apps.insert(name);
            true
        }
        Ok(
            Change::Cert { .. }
            | Change::CachePurge { .. }
            | Change::WafReload { .. }
            | Change::Filter { .. },
        ) => true,
        Ok(Change::Resync) | Err(_) => false,
    }
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issuer_with(orders_per_3h: usize) -> (Issuer, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = switchyard_store::EmbeddedStore::open(dir.path()).expect("store");
        let settings = AcmeSettings {
            directory: "https://ca.test/dir".into(),
            email: None,
            eab: None,
            ca_file: None,
            check_interval: Duration::from_secs(60),
            orders_per_3h,
            challenge: ChallengeKind::Http01,
        };
        (Issuer::new(settings, Arc::new(store)).expect("issuer"), dir)
    }

    #[test]
    fn the_cas_limits_across_domains_defer_orders() {
        let (issuer, _dir) = issuer_with(1000);
        for i in 0..CERTIFICATES_PER_REGISTERED_DOMAIN {
            assert_eq!(issuer.may_order(&format!("s{i}.example.com")), Ok(()));
        }
        let refused = issuer.may_order("one-more.example.com");
        assert!(
            refused.is_err_and(|why| why.contains("registered domain")),
            "the 51st of example.com this week waits"
        );
        assert_eq!(
            issuer.may_order("shop.example.org"),
            Ok(()),
            "another registered domain"
        );

        let (issuer, _dir) = issuer_with(3);
        for i in 0..3 {
            assert_eq!(issuer.may_order(&format!("d{i}.test")), Ok(()));
        }
        assert!(issuer
            .may_order("d3.test")
            .is_err_and(|why| why.contains("orders per 3 hours")));
    }

    #[test]
    fn certificates_are_counted_by_registered_domain() {
        let cases = [
            ("shop.example.com", "example.com"),
            ("a.b.example.co.uk", "example.co.uk"),
            ("tenant.herokuapp.com", "tenant.herokuapp.com"),
            ("example.com", "example.com"),
        ];
        for (domain, registered) in cases {
            assert_eq!(registered_domain(domain), registered, "{domain}");
        }
    }
}
