//! Host → app resolution with a bounded, lazily filled in-process cache in front of the
//! store. A change event touches only the entries it names, so its cost does not depend on
//! how many apps exist.
//!
//! Fills race with changes: a request may read the store just before a write commits and
//! insert the old answer just after the change's invalidation ran. Every key hashes to a
//! stripe with an epoch; a change bumps the epoch under the stripe's lock, and a fill only
//! inserts if the epoch it saw before reading the store is still current.

use std::collections::HashSet;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;
use quick_cache::sync::Cache;
use switchyard_model::{App, BackendAddress, CacheStore, Change};
use switchyard_store::{Store, StoreError};

use crate::metrics;
use crate::response_cache::memory::{AppResponseCache, CacheBudget};
use crate::routing::balancer::Upstream;
use crate::routing::filter_modules::{AppFilters, FilterModules};
use crate::routing::mirror_state::MirrorState;
use crate::routing::names::{BackendNames, Endpoint};
use crate::stage::chain::Chain;
use crate::stage::header_rules::Rules;
use crate::traffic::app_requests::{AppRequests, REQUEST_COUNTS};
use crate::traffic::deleted_apps::DeletedApps;

const STRIPES: usize = 256;
/// Deepest wildcard parent tried for one host: bounds the lookups an odd Host can cost.
const MAX_WILDCARD_DEPTH: usize = 8;

/// Which stored domain routed a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DomainMatch {
    /// The host itself.
    Exact,
    /// This wildcard (`*.example.com`).
    Wildcard(String),
}

/// The parents of `host` a wildcard may be stored for, most specific first:
/// `a.b.example.com` → `b.example.com`, `example.com`. At most [`MAX_WILDCARD_DEPTH`] (an
/// odd Host costs a bounded number of lookups), and never a bare TLD (`*.com` cannot be
/// stored).
pub(crate) fn wildcard_parents(host: &str) -> impl Iterator<Item = &str> {
    std::iter::successors(host.split_once('.').map(|(_, rest)| rest), |parent| {
        parent.split_once('.').map(|(_, rest)| rest)
    })
    .take_while(|parent| parent.contains('.'))
    .take(MAX_WILDCARD_DEPTH)
}

/// Everything the request path needs about one app, built once per change.
#[derive(Debug)]
pub(crate) struct AppRoute {
    /// The app as stored.
    pub(crate) app: App,
    /// Its backends with their live state.
    pub(crate) upstream: Upstream,
    /// Live state of its traffic mirroring, when it mirrors.
    pub(crate) mirror: Option<Box<MirrorState>>,
    /// Its cached responses, when it caches.
    pub(crate) response_cache: Option<Arc<AppResponseCache>>,
    /// Its answered requests, shared by every version of its route.
    pub(crate) requests: Arc<AppRequests>,
    /// Its backends' sticky-session tokens, when it has affinity (made on first use).
    pub(crate) affinity: Option<Box<std::sync::OnceLock<crate::routing::affinity_tokens::Tokens>>>,
    /// The stages its settings switch on, built with the route.
    pub(crate) chain: Chain,
    /// Its header rules with their names and values made, when it has any.
    pub(crate) header_rules: Option<Box<Rules>>,
    /// Its proxy-wasm filters, when it has any.
    pub(crate) filters: Option<Box<AppFilters>>,
}

/// Sizes of the route caches.
#[derive(Debug, Clone, Copy)]
pub struct RouteCacheLimits {
    /// Most apps kept built in memory.
    pub apps: usize,
    /// Most domain → app answers (including "no such domain") kept.
    pub domains: usize,
    /// Bytes of cached responses, over all apps.
    pub response_bytes: u64,
}

/// What the store said of an app when a change was applied.
enum Stored {
    Present,
    Gone,
    /// Not asked (the app was not cached) or not readable.
    Unknown,
}

/// The in-process routing view over the store.
pub struct RouteCache {
    store: Arc<dyn Store>,
    /// Stored domain (`a.com`, `*.a.com`) → owning app; `None` caches "nobody owns it".
    domains: Cache<String, Option<Arc<str>>>,
    apps: Cache<String, Arc<AppRoute>>,
    epochs: Vec<Mutex<u64>>,
    hasher: RandomState,
    /// Names of cached apps that have active health checks: the health checker walks this
    /// short list instead of every cached route.
    health_checked: Mutex<HashSet<String>>,
    /// Told when an app with a health check enters the list: the checker waits on it while
    /// the list is empty instead of ticking on an idle router.
    health_check_added: tokio::sync::Notify,
    response_budget: Arc<CacheBudget>,
    /// Addresses of backends given by name; without it, named backends get no address.
    names: Option<Arc<BackendNames>>,
    /// Where deletions (and apps routed again) are told, for their metric series.
    deleted: DeletedApps,
    /// The proxy-wasm modules apps' filters run; without it, apps with filters answer 500.
    filters: Option<Arc<FilterModules>>,
}

impl RouteCache {
    /// The store it reads.
    pub(crate) fn store(&self) -> &dyn Store {
        self.store.as_ref()
    }

    /// A cache over `store`.
    pub fn new(store: Arc<dyn Store>, limits: RouteCacheLimits) -> Self {
        metrics::register_all();
        Self {
            store,
            domains: Cache::new(limits.domains.max(1)),
            apps: Cache::new(limits.apps.max(1)),
            epochs: (0..STRIPES).map(|_| Mutex::new(0)).collect(),
            hasher: RandomState::new(),
            health_checked: Mutex::new(HashSet::new()),
            health_check_added: tokio::sync::Notify::new(),
            response_budget: CacheBudget::new(limits.response_bytes),
            names: None,
            deleted: DeletedApps::default(),
            filters: None,
        }
    }

    /// Apps' filters are compiled and run with `filters`.
    pub fn with_filters(mut self, filters: Arc<FilterModules>) -> Self {
        self.filters = Some(filters);
        self
    }

    /// The modules apps' filters run.
    pub fn filter_modules(&self) -> Option<&Arc<FilterModules>> {
        self.filters.as_ref()
    }

    /// Routes resolve their backends' names through `names`.
    pub fn with_backend_names(mut self, names: Arc<BackendNames>) -> Self {
        self.names = Some(names);
        self
    }

    /// Whether the cached route of `app` lists the backend `address` (a backend name's
    /// resolver forgets the names no cached route uses).
    pub fn uses_backend(&self, app: &str, address: &BackendAddress) -> bool {
        self.apps
            .get(app)
            .is_some_and(|route| route.app.backends.iter().any(|b| b.address == *address))
    }

    /// Builds `app`'s route: its backends' names resolved to their current addresses.
    fn build(&self, app: App, previous: Option<&AppRoute>) -> AppRoute {
        self.deleted.routed_again(app.name.as_str());
        let endpoints = match &self.names {
            Some(names) => names.endpoints(&app),
            None => ip_endpoints(&app),
        };
        let filters = self.filters.as_deref().and_then(|modules| {
            let previous = previous.and_then(|p| p.filters.as_deref());
            modules.filters_for(&app, previous)
        });
        let mut route = build_route(app, &endpoints, previous, &self.response_budget);
        route.filters = filters;
        route
    }

    /// Waits, the first time only, for the names `app` uses to be resolved, and for the
    /// modules of its filters to be loaded.
    async fn first_answers(&self, app: &App) {
        if let Some(names) = &self.names {
            names.first_answers(app).await;
        }
        if let Some(filters) = &self.filters {
            filters.load_for(app, self.store.as_ref()).await;
        }
    }

    /// Loads the filter `name` again and rebuilds the cached routes of the apps that run
    /// it (no store read for them: the apps did not change).
    async fn reload_filter(&self, name: &str) {
        let Some(filters) = &self.filters else {
            return;
        };
        filters.reload(name, self.store.as_ref()).await;
        let users: Vec<String> = (self.apps.iter())
            .filter(|(_, route)| route.app.filters.iter().any(|f| f.name == name))
            .map(|(key, _)| key)
            .collect();
        for app in users {
            if let Some(previous) = self.apps.get(&app) {
                let route = Arc::new(self.build(previous.app.clone(), Some(&previous)));
                self.invalidate(&app, || self.apps.insert(app.clone(), route.clone()));
            }
        }
    }

    /// Rebuilds the cached route of `name` from the app it holds, with its names' current
    /// addresses (they changed); addresses that left are retired. No store read: a DNS
    /// change during a store outage still applies.
    pub(crate) fn rebuild_with_new_addresses(&self, name: &str) {
        let Some(previous) = self.apps.get(name) else {
            return;
        };
        let route = Arc::new(self.build(previous.app.clone(), Some(&previous)));
        self.invalidate(name, || self.apps.insert(name.to_string(), route.clone()));
        previous.upstream.retire_missing_from(&route.upstream);
    }

    /// The app serving `host` (already normalised): exact domain first, then the most
    /// specific wildcard. `Ok(None)` means no app owns it.
    pub(crate) async fn resolve(&self, host: &str) -> Result<Option<Arc<AppRoute>>, StoreError> {
        let resolved = self.resolve_through_cache(host).await;
        if matches!(resolved, Ok(Some(_))) && !self.store.available() {
            // Served from memory while the store is away: the known route keeps working.
            metrics::STALE_SERVES.inc();
        }
        resolved
    }

    async fn resolve_through_cache(&self, host: &str) -> Result<Option<Arc<AppRoute>>, StoreError> {
        match self.matching_domain(host).await? {
            Some((_, name)) => self.app(&name).await,
            None => Ok(None),
        }
    }

    /// The stored domain that routes `host` and its app: the host itself, else the most
    /// specific wildcard above it.
    pub(crate) async fn matching_domain(
        &self,
        host: &str,
    ) -> Result<Option<(DomainMatch, Arc<str>)>, StoreError> {
        if let Some(name) = self.owner_of(host).await? {
            return Ok(Some((DomainMatch::Exact, name)));
        }
        for parent in wildcard_parents(host) {
            let wildcard = format!("*.{parent}");
            if let Some(name) = self.owner_of(&wildcard).await? {
                return Ok(Some((DomainMatch::Wildcard(wildcard), name)));
            }
        }
        Ok(None)
    }

    /// The app named `name`, building its route on first use.
    pub(crate) async fn app(&self, name: &str) -> Result<Option<Arc<AppRoute>>, StoreError> {
        if let Some(route) = self.apps.get(name) {
            metrics::ROUTE_CACHE_HITS.inc();
            return Ok(Some(route));
        }
        metrics::ROUTE_CACHE_MISSES.inc();
        let epoch = self.epoch_of(name);
        let Some(app) = self.store.get_app(name).await? else {
            return Ok(None);
        };
        self.first_answers(&app).await;
        let mut route = Arc::new(self.build(app, None));
        // Concurrent first requests each build a route; all must share one, or each would
        // have its own backend state and response cache (and coalesce misses only among
        // themselves). The first inserted wins: with the epoch unchanged it is as current.
        self.fill(name, epoch, || match self.apps.get(name) {
            Some(first) => route = first,
            None => self.apps.insert(name.to_string(), route.clone()),
        });
        self.note_health_check(&route);
        Ok(Some(route))
    }

    async fn owner_of(&self, domain: &str) -> Result<Option<Arc<str>>, StoreError> {
        if let Some(owner) = self.domains.get(domain) {
            metrics::ROUTE_CACHE_HITS.inc();
            return Ok(owner);
        }
        metrics::ROUTE_CACHE_MISSES.inc();
        let epoch = self.epoch_of(domain);
        let owner: Option<Arc<str>> = self.store.app_for_domain(domain).await?.map(Arc::from);
        self.fill(domain, epoch, || {
            self.domains.insert(domain.to_string(), owner.clone())
        });
        Ok(owner)
    }

    /// Applies one change from the store. Cached apps are rebuilt in place (keeping backend
    /// state); uncached ones stay uncached until a request needs them.
    pub async fn apply(&self, change: &Change) {
        match change {
            Change::App { name, domains } => {
                for domain in domains {
                    self.invalidate(domain, || {
                        self.domains.remove(domain);
                    });
                }
                let stored = self.refresh_app(name).await;
                self.note_if_deleted(name, stored).await;
            }
            Change::Resync => {
                if let Some(filters) = &self.filters {
                    for name in filters.names() {
                        self.reload_filter(&name).await;
                    }
                }
                self.resync().await
            }
            Change::Filter { name } => self.reload_filter(name).await,
            Change::CachePurge { app, path, prefix } => {
                if let Some(cache) = self.apps.get(app).and_then(|r| r.response_cache.clone()) {
                    cache.purge(path, *prefix);
                }
            }
            Change::Cert { .. } | Change::WafReload { .. } => {}
        }
        self.publish_sizes();
    }

    /// Rebuilds a cached app from the store, or drops it; what the store said of it.
    async fn refresh_app(&self, name: &str) -> Stored {
        let Some(previous) = self.apps.get(name) else {
            // Bump anyway: a fill for this app may be in flight with the old value.
            self.invalidate(name, || {});
            return Stored::Unknown;
        };
        match self.store.get_app(name).await {
            Ok(Some(app)) => {
                self.first_answers(&app).await;
                let route = Arc::new(self.build(app, Some(&previous)));
                self.note_health_check(&route);
                self.invalidate(name, || self.apps.insert(name.to_string(), route.clone()));
                previous.upstream.retire_missing_from(&route.upstream);
                Stored::Present
            }
            Ok(None) => {
                self.invalidate(name, || {
                    self.apps.remove(name);
                });
                previous.upstream.retire_all();
                Stored::Gone
            }
            Err(e) => {
                // Dropping the entry makes the next request read the store again, which is
                // better than routing with a version we know is outdated.
                log::warn!("cannot refresh app '{name}' after a change: {e}; evicting it");
                self.invalidate(name, || {
                    self.apps.remove(name);
                });
                Stored::Unknown
            }
        }
    }

    /// Notes `name` as deleted when a route of it was built here (so it may have metric
    /// series) and the store no longer has it; a full batch is forgotten at once. The store
    /// is asked only when the refresh did not ask it (the app was not cached) or could not
    /// read it.
    async fn note_if_deleted(&self, name: &str, stored: Stored) {
        if !REQUEST_COUNTS.has(name) {
            return;
        }
        let gone = match stored {
            Stored::Gone => true,
            Stored::Present => false,
            Stored::Unknown => matches!(self.store.get_app(name).await, Ok(None)),
        };
        if gone {
            self.deleted.note(name);
        }
    }

    /// Revalidates every cached entry after events may have been missed. Entries are checked
    /// one by one against the store rather than flushed, so traffic keeps hitting the cache.
    async fn resync(&self) {
        let domains: Vec<String> = self.domains.iter().map(|(k, _)| k).collect();
        for domain in domains {
            let cached = self.domains.get(&domain);
            match self.store.app_for_domain(&domain).await {
                Ok(owner) if cached.as_ref().map(|c| c.as_deref()) == Some(owner.as_deref()) => {}
                Ok(_) => self.invalidate(&domain, || {
                    self.domains.remove(&domain);
                }),
                Err(e) => return log_interrupted_resync(&e),
            }
        }
        let names: Vec<String> = self.apps.iter().map(|(k, _)| k).collect();
        for name in names {
            let unchanged = match (self.apps.get(&name), self.store.get_app(&name).await) {
                (Some(cached), Ok(Some(stored))) => cached.app == stored,
                (_, Err(e)) => return log_interrupted_resync(&e),
                _ => false,
            };
            if !unchanged {
                let stored = self.refresh_app(&name).await;
                self.note_if_deleted(&name, stored).await;
            }
        }
        // An app with series here but no cached route (evicted, or not asked for since) was
        // deleted unseen if the store no longer has it: without this, its series stayed.
        let mut uncached = Vec::new();
        REQUEST_COUNTS.each_app(|name, _| {
            if !self.apps.contains_key(name) {
                uncached.push(name.to_string());
            }
        });
        for name in uncached {
            match self.store.get_app(&name).await {
                Ok(None) => self.deleted.note(&name),
                Ok(Some(_)) => {}
                Err(e) => return log_interrupted_resync(&e),
            }
        }
    }

    /// Cached routes of apps with active health checks. Names whose route left the cache
    /// (evicted, deleted, or its check switched off) are forgotten here.
    pub(crate) fn health_checked_routes(&self) -> Vec<Arc<AppRoute>> {
        let mut names = self.health_checked.lock();
        let mut routes = Vec::with_capacity(names.len());
        names.retain(|name| match self.apps.get(name) {
            Some(route) if route.app.health_check.is_some() => {
                routes.push(route);
                true
            }
            _ => false,
        });
        routes
    }

    /// Resolves once an app with a health check has entered the list since the checker last
    /// found it empty (a permit is kept for a checker not yet waiting).
    pub(crate) async fn health_check_added(&self) {
        self.health_check_added.notified().await;
    }

    fn note_health_check(&self, route: &AppRoute) {
        if route.app.health_check.is_some()
            && self
                .health_checked
                .lock()
                .insert(route.app.name.to_string())
        {
            self.health_check_added.notify_one();
        }
    }

    fn publish_sizes(&self) {
        metrics::ROUTE_CACHE_ENTRIES
            .with_label_values(&["apps"])
            .set(self.apps.len() as i64);
        metrics::ROUTE_CACHE_ENTRIES
            .with_label_values(&["domains"])
            .set(self.domains.len() as i64);
    }

    fn stripe<K: Hash + ?Sized>(&self, key: &K) -> &Mutex<u64> {
        &self.epochs[(self.hasher.hash_one(key) as usize) % STRIPES]
    }

    fn epoch_of(&self, key: &str) -> u64 {
        *self.stripe(key).lock()
    }

    fn fill(&self, key: &str, seen_epoch: u64, insert: impl FnOnce()) {
        let epoch = self.stripe(key).lock();
        if *epoch == seen_epoch {
            insert();
        }
        drop(epoch);
        self.publish_sizes();
    }

    fn invalidate(&self, key: &str, apply: impl FnOnce()) {
        let mut epoch = self.stripe(key).lock();
        *epoch += 1;
        apply();
    }
}

/// A store that fails mid-resync is away again: keep every entry (stale beats nothing) and
/// let the next reconnection start another resync.
fn log_interrupted_resync(e: &StoreError) {
    log::warn!("route-cache revalidation interrupted, cached routes kept: {e}");
}

/// The route of `app` as the cache would build it, for unit tests of the stages.
#[cfg(test)]
pub(crate) fn route_of(app: App) -> Arc<AppRoute> {
    let endpoints = ip_endpoints(&app);
    Arc::new(build_route(app, &endpoints, None, &CacheBudget::new(0)))
}

/// The app's backends given as IP addresses; names have no address without a resolver.
fn ip_endpoints(app: &App) -> Vec<Endpoint> {
    app.backends
        .iter()
        .filter_map(|b| {
            b.address.ip().map(|address| Endpoint {
                address,
                weight: b.weight,
            })
        })
        .collect()
}

fn build_route(
    mut app: App,
    endpoints: &[Endpoint],
    previous: Option<&AppRoute>,
    budget: &Arc<CacheBudget>,
) -> AppRoute {
    // The route keeps the app for as long as it is cached. A list deserialised from the
    // store has room for four entries when it holds one (serde grows it while reading): 180
    // of the 1,130 B a cached app cost at 100,000 one-domain, one-backend apps.
    app.domains.shrink_to_fit();
    app.backends.shrink_to_fit();
    let upstream = Upstream::new(endpoints, app.balancer, previous.map(|p| &p.upstream));
    let mirror = app.mirror.as_ref().map(|_| {
        let previous = previous.and_then(|p| p.mirror.as_deref());
        Box::new(MirrorState::new(app.name.as_str(), previous))
    });
    // A change that keeps the cache's size keeps its responses (a scale or deploy does not
    // empty the cache); purges are explicit.
    let response_cache = app.cache.as_ref().map(|policy| {
        // Apps whose cache lives in Redis hold no response bytes here.
        let in_memory = match policy.store {
            CacheStore::Memory => policy.max_bytes,
            CacheStore::Redis | CacheStore::RedisVersioned => 0,
        };
        previous
            .and_then(|p| p.response_cache.clone())
            .filter(|cache| cache.sized_for(in_memory))
            .unwrap_or_else(|| {
                Arc::new(AppResponseCache::new(app.name.as_str(), in_memory, budget))
            })
    });
    let requests = REQUEST_COUNTS.for_app(app.name.as_str());
    (requests.cost.share.weight).store(u32::from(app.cpu_weight), Ordering::Relaxed);
    let affinity = app.affinity.as_ref().map(|_| Box::default());
    let chain = Chain::for_app(&app);
    let header_rules = Rules::of(&app);
    AppRoute {
        chain,
        header_rules,
        filters: None,
        app,
        upstream,
        mirror,
        response_cache,
        requests,
        affinity,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_model::parse_app_spec;

    /// An app as a store returns it: read back from its JSON.
    fn stored_app() -> App {
        let spec = serde_json::json!({"domains": ["a.test"], "backends": ["127.0.0.1:9"]});
        let parsed = parse_app_spec("a", &spec).expect("a valid spec");
        let json = serde_json::to_string(&parsed).expect("an app serialises");
        serde_json::from_str(&json).expect("and reads back")
    }

    fn app(name: &str, domains: &[&str]) -> App {
        let spec = serde_json::json!({"domains": domains, "backends": ["127.0.0.1:9"]});
        parse_app_spec(name, &spec).expect("a valid spec")
    }

    /// A route cache over an embedded store in a temporary directory, holding `apps`.
    async fn cache_with(
        apps: &[App],
    ) -> (
        RouteCache,
        switchyard_store::EmbeddedStore,
        tempfile::TempDir,
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = switchyard_store::EmbeddedStore::open(dir.path()).expect("store");
        for app in apps {
            store.put_app(app.clone()).await.expect("stored");
        }
        let limits = RouteCacheLimits {
            apps: 100,
            domains: 400,
            response_bytes: 0,
        };
        (RouteCache::new(Arc::new(store.clone()), limits), store, dir)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_exact_domain_wins_then_the_most_specific_wildcard_at_any_depth() {
        let (cache, _store, _dir) = cache_with(&[
            app("exact", &["a.test"]),
            app("wide", &["*.a.test"]),
            app("narrow", &["*.b.a.test"]),
            app("named", &["c.b.a.test"]),
        ])
        .await;
        for (host, owner) in [
            ("a.test", Some("exact")),
            ("x.a.test", Some("wide")),
            ("x.y.z.a.test", Some("wide")),
            ("b.a.test", Some("wide")),
            ("x.b.a.test", Some("narrow")),
            ("deep.x.b.a.test", Some("narrow")),
            ("c.b.a.test", Some("named")),
            ("other.test", None),
            ("test", None),
        ] {
            let resolved = cache.resolve(host).await.expect("the store answers");
            assert_eq!(
                resolved.as_ref().map(|r| r.app.name.as_str()),
                owner,
                "{host}"
            );
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_change_event_makes_the_next_lookup_read_the_store_again() {
        let (cache, store, _dir) = cache_with(&[app("shop", &["shop.test"])]).await;
        let first = cache
            .resolve("shop.test")
            .await
            .expect("answers")
            .expect("routed");
        let before = cache.resolve("www.shop.test").await.expect("answers");
        assert!(before.is_none(), "not a domain of the app yet");
        store
            .put_app(app("shop", &["shop.test", "www.shop.test"]))
            .await
            .expect("stored");
        let unchanged = cache.resolve("www.shop.test").await.expect("answers");
        assert!(
            unchanged.is_none(),
            "the absence was cached until the event"
        );
        cache
            .apply(&switchyard_model::Change::App {
                name: "shop".into(),
                domains: vec!["shop.test".into(), "www.shop.test".into()],
            })
            .await;
        let after = cache.resolve("www.shop.test").await.expect("answers");
        let after = after.expect("routed once the event is applied");
        assert!(!Arc::ptr_eq(&first, &after), "the route was rebuilt");
        assert_eq!(after.app.domains.len(), 2);
    }

    /// Whether `/metrics` (the default registry) has a series labelled `app="{app}"`.
    fn exported_for(app: &str) -> bool {
        prometheus::gather()
            .iter()
            .flat_map(|family| family.get_metric().iter())
            .flat_map(|series| series.get_label().iter())
            .any(|pair| pair.get_name() == "app" && pair.get_value() == app)
    }

    async fn forget_batch(cache: &RouteCache) {
        let batch = cache.deleted.forget_noted().expect("a batch to forget");
        batch.await.expect("the batch ran");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_deleted_apps_series_are_forgotten_in_the_next_batch_and_the_others_stay() {
        // Names of their own: the registry is the process's, shared with other tests.
        let names = [
            "deleted-apps-leaving",
            "deleted-apps-staying",
            "deleted-apps-back",
        ];
        let host = |name: &str| format!("{name}.test");
        let apps: Vec<App> = names.iter().map(|n| app(n, &[&host(n)])).collect();
        let (cache, store, _dir) = cache_with(&apps).await;
        let [leaving, staying, back] = names;
        for name in names {
            let route = cache.resolve(&host(name)).await.expect("answers");
            route.expect("routed").requests.record(200, None);
            metrics::CACHE_REQUESTS
                .with_label_values(&[name, "MISS"])
                .inc();
            assert!(exported_for(name));
        }
        for name in [leaving, back] {
            assert!(store.delete_app(name).await.expect("deleted"));
            cache
                .apply(&switchyard_model::Change::App {
                    name: name.into(),
                    domains: vec![host(name)],
                })
                .await;
        }
        // Created again before the batch, and asked for: its new route holds the slot.
        store.put_app(apps[2].clone()).await.expect("stored again");
        let change = switchyard_model::Change::App {
            name: back.into(),
            domains: vec![host(back)],
        };
        cache.apply(&change).await;
        let again = cache.resolve(&host(back)).await.expect("answers");
        assert!(again.is_some());
        // Noted, not yet forgotten: that is done in batches, on the blocking pool.
        assert!(exported_for(leaving));
        forget_batch(&cache).await;
        assert!(!exported_for(leaving));
        assert!(!REQUEST_COUNTS.has(leaving));
        for kept in [staying, back] {
            assert!(exported_for(kept), "{kept}'s series stay");
            assert!(REQUEST_COUNTS.has(kept));
        }
        // The app created again is the new app's for good, not noted for the next batch.
        assert!(!cache.deleted.is_noted(back));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_app_deleted_under_a_request_is_forgotten_in_the_batch_after_the_request_ends() {
        let name = "deleted-apps-under-a-request";
        let host = format!("{name}.test");
        let (cache, store, _dir) = cache_with(&[app(name, &[&host])]).await;
        let under_way = cache
            .resolve(&host)
            .await
            .expect("answers")
            .expect("routed");
        assert!(store.delete_app(name).await.expect("deleted"));
        cache
            .apply(&switchyard_model::Change::App {
                name: name.into(),
                domains: vec![host.clone()],
            })
            .await;
        // The request holds the slot through the first batch: kept, and noted again.
        forget_batch(&cache).await;
        assert!(cache.deleted.is_noted(name));
        assert!(REQUEST_COUNTS.has(name));
        // What it counts as it ends must leave with the next batch.
        under_way.requests.record(200, None);
        metrics::CACHE_REQUESTS
            .with_label_values(&[name, "MISS"])
            .inc();
        drop(under_way);
        assert!(exported_for(name));
        forget_batch(&cache).await;
        assert!(!exported_for(name));
        assert!(!REQUEST_COUNTS.has(name));
        assert!(!cache.deleted.is_noted(name));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_app_deleted_unseen_and_not_cached_is_noted_at_the_resync() {
        let names = ["deleted-apps-unseen", "deleted-apps-uncached-kept"];
        let host = |name: &str| format!("{name}.test");
        let apps: Vec<App> = names.iter().map(|n| app(n, &[&host(n)])).collect();
        let (cache, store, _dir) = cache_with(&apps).await;
        for name in names {
            let route = cache.resolve(&host(name)).await.expect("answers");
            route.expect("routed").requests.record(200, None);
            // Evicted since: the resync's walk of cached routes does not see it.
            cache.apps.remove(name);
        }
        let [unseen, kept] = names;
        // Deleted while the change events were missed.
        assert!(store.delete_app(unseen).await.expect("deleted"));
        cache.apply(&Change::Resync).await;
        // Noted for the next batch (forgetting is the tests above'; a batch here could
        // forget the slots of other tests' apps, which this cache's store does not have).
        assert!(cache.deleted.is_noted(unseen));
        assert!(!cache.deleted.is_noted(kept), "still stored");
    }

    #[test]
    fn a_cached_route_keeps_its_lists_without_spare_room() {
        let app = stored_app();
        // What the shrinking is for: deserialised lists come with room to spare.
        assert!(app.domains.capacity() > app.domains.len());
        assert!(app.backends.capacity() > app.backends.len());
        let route = build_route(app, &[], None, &CacheBudget::new(0));
        assert_eq!(route.app.domains.capacity(), 1);
        assert_eq!(route.app.backends.capacity(), 1);
    }
}
