//! Backends given by DNS name (`web-1.internal:8080`) or SRV name
//! (`srv:_http._tcp.web.service.consul`), resolved in the background with hickory-resolver
//! (`/etc/resolv.conf` and `/etc/hosts`, or the files and servers given) and re-resolved at
//! each answer's TTL, bounded by `--dns-min-ttl-s` and `--dns-max-ttl-s`.
//!
//! The request path never waits for DNS once a name has had its first answer: routes are
//! built from the addresses held here. Only the first request to an app whose name this
//! router has never asked about waits for that first answer (bounded by the resolver's
//! timeout), as a route read from the store would. A failed resolution (a timeout, SERVFAIL,
//! or a name that no longer exists) keeps the last good addresses — a DNS outage at 3 a.m.
//! must not take an app down — and says so in metrics and in the admin API's view of the
//! app. When the addresses change, the routes of the apps using the name are rebuilt by the
//! change follower, and addresses that left are drained like removed backends: no new
//! requests, open connections (WebSockets) go on.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures_util::StreamExt;
use hickory_resolver::config::{NameServerConfigGroup, ResolveHosts, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::{Hosts, ResolveError, TokioResolver};
use parking_lot::{Mutex, RwLock};
use switchyard_model::{App, BackendAddress, ResolvedBackend, MAX_WEIGHT};
use tokio::sync::Notify;

use crate::metrics;
use crate::shutdown::ShutdownWatch;
use crate::wall_clock::unix_s;

/// Names resolved at the same time, at most.
const CONCURRENT_RESOLUTIONS: usize = 32;
/// Most targets of one SRV name that are resolved.
const MAX_SRV_TARGETS: usize = 64;
/// Most addresses one name contributes to a route.
const MAX_ADDRESSES_PER_NAME: usize = 256;
/// How often the hosts file is checked for changes.
const HOSTS_CHECK_EVERY: Duration = Duration::from_secs(1);
/// A name no cached route has used for this long is forgotten.
const UNUSED_NAME_KEPT: Duration = Duration::from_secs(120);

/// How names are resolved.
#[derive(Debug, Clone)]
pub struct NameSettings {
    /// Shortest time between two resolutions of a name, whatever its TTL.
    pub min_ttl: Duration,
    /// Longest time an answer is kept before asking again, whatever its TTL.
    pub max_ttl: Duration,
    /// Deadline of one query.
    pub timeout: Duration,
    /// Most names followed; a route naming one more gets no address for it.
    pub max_names: usize,
    /// The resolver configuration (nameservers, search domains, ndots).
    pub resolv_conf: PathBuf,
    /// Static names, read again when the file changes.
    pub hosts_file: PathBuf,
    /// Nameservers to ask instead of resolv.conf's (e.g. Consul's DNS on port 8600).
    pub servers: Vec<SocketAddr>,
}

impl Default for NameSettings {
    fn default() -> Self {
        Self {
            min_ttl: Duration::from_secs(1),
            max_ttl: Duration::from_secs(60),
            timeout: Duration::from_secs(2),
            max_names: 10_000,
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            hosts_file: PathBuf::from("/etc/hosts"),
            servers: Vec::new(),
        }
    }
}

/// One address a route sends to, with its weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub(crate) address: SocketAddr,
    pub(crate) weight: u16,
}

/// What is known of one name.
struct NameEntry {
    /// The last good answer: addresses and, for SRV, their weights.
    addresses: Vec<(SocketAddr, Option<u16>)>,
    /// Whether it was asked at least once (a first request waits until then).
    attempted: bool,
    last_success_unix: Option<u64>,
    /// Why the last resolution failed, while it keeps failing.
    error: Option<String>,
    failures: u32,
    next_at: Instant,
    resolving: bool,
    /// Apps whose routes use the name.
    apps: BTreeSet<String>,
    last_used: Instant,
}

impl NameEntry {
    fn new(now: Instant) -> Self {
        Self {
            addresses: Vec::new(),
            attempted: false,
            last_success_unix: None,
            error: None,
            failures: 0,
            next_at: now,
            resolving: false,
            apps: BTreeSet::new(),
            last_used: now,
        }
    }

    fn state(&self) -> &'static str {
        match (&self.error, self.last_success_unix) {
            (None, Some(_)) => "resolved",
            (Some(_), Some(_)) => "stale",
            _ => "unresolved",
        }
    }
}

/// The names every cached route uses, their last good addresses, and the task that keeps
/// them current.
pub struct BackendNames {
    settings: NameSettings,
    resolver: RwLock<Arc<TokioResolver>>,
    hosts_stamp: Mutex<Option<SystemTime>>,
    entries: Mutex<HashMap<BackendAddress, NameEntry>>,
    /// A name was added: resolve it now.
    wake: Notify,
    /// A resolution round ended: first requests waiting for a name look again.
    resolved: Notify,
    /// Apps whose routes must be rebuilt because a name's addresses changed.
    changed_apps: Mutex<BTreeSet<String>>,
    changed: Notify,
}

impl BackendNames {
    /// A resolver with `settings`. An unreadable default resolv.conf leaves only the hosts
    /// file and `servers`; an unreadable file named explicitly is the caller's error.
    pub fn new(settings: NameSettings) -> Result<Self, String> {
        metrics::register_all();
        metrics::DNS_NAMES_CAPACITY.set(settings.max_names as i64);
        let (resolver, stamp) = build_resolver(&settings)?;
        Ok(Self {
            settings,
            resolver: RwLock::new(Arc::new(resolver)),
            hosts_stamp: Mutex::new(stamp),
            entries: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            resolved: Notify::new(),
            changed_apps: Mutex::new(BTreeSet::new()),
            changed: Notify::new(),
        })
    }

    /// The addresses `app`'s backends stand for now: IP backends as they are, each name's
    /// last good addresses (with the name's weight; SRV records bring their own). A name
    /// not followed yet is added, to be resolved in the background. An address listed
    /// twice counts once.
    pub(crate) fn endpoints(&self, app: &App) -> Vec<Endpoint> {
        let mut endpoints: Vec<Endpoint> = Vec::with_capacity(app.backends.len());
        let mut push = |address: SocketAddr, weight: u16| {
            if !endpoints.iter().any(|e| e.address == address) {
                endpoints.push(Endpoint { address, weight });
            }
        };
        let mut entries = None;
        for backend in &app.backends {
            if let BackendAddress::Ip(address) = backend.address {
                push(address, backend.weight);
                continue;
            }
            let entries = entries.get_or_insert_with(|| self.entries.lock());
            if let Some(entry) = self.entry(entries, &backend.address) {
                entry.apps.insert(app.name.to_string());
                entry.last_used = Instant::now();
                for (address, weight) in &entry.addresses {
                    push(*address, weight.unwrap_or(backend.weight));
                }
            }
        }
        endpoints
    }

    /// The entry of `name`, added when absent and there is room.
    fn entry<'a>(
        &self,
        entries: &'a mut HashMap<BackendAddress, NameEntry>,
        name: &BackendAddress,
    ) -> Option<&'a mut NameEntry> {
        if !entries.contains_key(name) {
            if entries.len() >= self.settings.max_names {
                metrics::DNS_NAMES_REFUSED.inc();
                log::warn!(
                    "{name} is not resolved: {} names are followed already (--dns-max-names)",
                    entries.len()
                );
                return None;
            }
            entries.insert(name.clone(), NameEntry::new(Instant::now()));
            self.wake.notify_one();
        }
        entries.get_mut(name)
    }

    /// Waits until every name of `app` was asked at least once (bounded by the query
    /// deadline): only a route built for a name this router never resolved waits here.
    pub(crate) async fn first_answers(&self, app: &App) {
        let names: Vec<&BackendAddress> = app
            .backends
            .iter()
            .map(|b| &b.address)
            .filter(|a| a.ip().is_none())
            .collect();
        if names.is_empty() {
            return;
        }
        let deadline = Instant::now() + self.settings.timeout + Duration::from_millis(200);
        loop {
            let round = self.resolved.notified();
            tokio::pin!(round);
            round.as_mut().enable();
            let waiting = {
                let mut entries = self.entries.lock();
                names.iter().any(|name| {
                    self.entry(&mut entries, name)
                        .is_some_and(|entry| !entry.attempted)
                })
            };
            if !waiting {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, round).await.is_err() {
                return;
            }
        }
    }

    /// What this router knows of `app`'s named backends, for the admin API.
    pub fn describe(&self, app: &App) -> Vec<ResolvedBackend> {
        let entries = self.entries.lock();
        let now = Instant::now();
        app.backends
            .iter()
            .filter(|b| b.address.ip().is_none())
            .map(|backend| match entries.get(&backend.address) {
                Some(entry) => ResolvedBackend {
                    backend: backend.address.to_string(),
                    state: entry.state(),
                    addresses: entry
                        .addresses
                        .iter()
                        .map(|(a, w)| match w {
                            Some(w) => format!("{a}={w}"),
                            None => a.to_string(),
                        })
                        .collect(),
                    last_success_unix: entry.last_success_unix,
                    error: entry.error.clone(),
                    next_resolution_in_ms: Some(
                        entry.next_at.saturating_duration_since(now).as_millis() as u64,
                    ),
                },
                None => ResolvedBackend {
                    backend: backend.address.to_string(),
                    state: "not in use on this router",
                    addresses: Vec::new(),
                    last_success_unix: None,
                    error: None,
                    next_resolution_in_ms: None,
                },
            })
            .collect()
    }

    /// Apps whose routes must be rebuilt since the last call.
    pub(crate) fn take_changed_apps(&self) -> BTreeSet<String> {
        std::mem::take(&mut *self.changed_apps.lock())
    }

    /// Resolves when names' addresses changed (see [`Self::take_changed_apps`]).
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Resolves due names until `shutdown`; forgets names no cached route uses, as
    /// `still_uses(app, name)` tells (the route cache's answer: whether its route of `app`
    /// still lists `name`).
    pub async fn run(
        self: Arc<Self>,
        still_uses: impl Fn(&str, &BackendAddress) -> bool,
        mut shutdown: ShutdownWatch,
    ) {
        let mut hosts_checked = Instant::now();
        loop {
            if hosts_checked.elapsed() >= HOSTS_CHECK_EVERY {
                hosts_checked = Instant::now();
                self.reload_hosts_if_changed();
            }
            let due = self.take_due(&still_uses);
            futures_util::stream::iter(due)
                .for_each_concurrent(CONCURRENT_RESOLUTIONS, |name| self.resolve_and_record(name))
                .await;
            self.resolved.notify_waiters();
            self.publish_counts();
            // With no name followed, nothing reads the hosts file: no timer until a route
            // names one (the file is checked again then, a second having passed).
            let next = self
                .entries
                .lock()
                .values()
                .map(|e| e.next_at)
                .min()
                .map(|due| due.min(hosts_checked + HOSTS_CHECK_EVERY));
            let due = async {
                match next {
                    Some(next) => tokio::time::sleep_until(next.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = due => {}
                () = self.wake.notified() => {}
                _ = shutdown.changed() => return,
            }
        }
    }

    /// Names whose time has come, marked as being resolved; unused ones are dropped.
    fn take_due(&self, still_uses: &impl Fn(&str, &BackendAddress) -> bool) -> Vec<BackendAddress> {
        let now = Instant::now();
        let mut entries = self.entries.lock();
        entries.retain(|name, entry| {
            if now.saturating_duration_since(entry.last_used) < UNUSED_NAME_KEPT {
                return true;
            }
            entry.apps.retain(|app| still_uses(app, name));
            !entry.apps.is_empty()
        });
        entries
            .iter_mut()
            .filter(|(_, entry)| entry.next_at <= now && !entry.resolving)
            .map(|(name, entry)| {
                entry.resolving = true;
                name.clone()
            })
            .collect()
    }

    async fn resolve_and_record(&self, name: BackendAddress) {
        let resolver = self.resolver.read().clone();
        let answer = tokio::time::timeout(
            self.settings.timeout * 2,
            resolve(&resolver, &name, self.settings.timeout),
        )
        .await
        .unwrap_or_else(|_| Err("no answer within the deadline".into()));
        let now = Instant::now();
        let mut entries = self.entries.lock();
        let Some(entry) = entries.get_mut(&name) else {
            return;
        };
        entry.resolving = false;
        entry.attempted = true;
        match answer {
            Ok((mut addresses, ttl)) => {
                addresses.sort();
                addresses.dedup_by_key(|(address, _)| *address);
                addresses.truncate(MAX_ADDRESSES_PER_NAME);
                let ttl = ttl.clamp(self.settings.min_ttl, self.settings.max_ttl);
                entry.next_at = now + ttl;
                entry.failures = 0;
                entry.last_success_unix = Some(unix_s());
                if entry.error.take().is_some() {
                    log::info!("{name} resolves again: {addresses:?}");
                }
                if entry.addresses != addresses {
                    if !entry.addresses.is_empty() {
                        log::info!(
                            "{name} now resolves to {addresses:?} (was {:?})",
                            entry.addresses
                        );
                    }
                    entry.addresses = addresses;
                    metrics::DNS_RESOLUTIONS
                        .with_label_values(&["changed"])
                        .inc();
                    self.changed_apps.lock().extend(entry.apps.iter().cloned());
                    self.changed.notify_one();
                } else {
                    metrics::DNS_RESOLUTIONS.with_label_values(&["same"]).inc();
                }
            }
            Err(reason) => {
                metrics::DNS_RESOLUTIONS
                    .with_label_values(&["failed"])
                    .inc();
                entry.failures = entry.failures.saturating_add(1);
                // Back off from the shortest TTL, doubling up to the longest: a name that
                // comes back is seen soon, a name gone for good costs little.
                let backoff = self
                    .settings
                    .min_ttl
                    .saturating_mul(1 << entry.failures.min(16))
                    .min(self.settings.max_ttl);
                entry.next_at = now + backoff;
                if entry.error.is_none() {
                    if entry.addresses.is_empty() {
                        log::warn!("{name} does not resolve: {reason}");
                    } else {
                        log::warn!(
                            "{name} does not resolve ({reason}); keeping its last addresses {:?}",
                            entry.addresses
                        );
                    }
                }
                entry.error = Some(reason);
            }
        }
    }

    fn publish_counts(&self) {
        let entries = self.entries.lock();
        for state in ["resolved", "stale", "unresolved"] {
            let count = entries.values().filter(|e| e.state() == state).count();
            metrics::DNS_NAMES
                .with_label_values(&[state])
                .set(count as i64);
        }
    }

    /// A changed hosts file is read again and every name asked again at once.
    fn reload_hosts_if_changed(&self) {
        let stamp = modified(&self.settings.hosts_file);
        if *self.hosts_stamp.lock() == stamp {
            return;
        }
        match build_resolver(&self.settings) {
            Ok((resolver, stamp)) => {
                *self.resolver.write() = Arc::new(resolver);
                *self.hosts_stamp.lock() = stamp;
                let now = Instant::now();
                for entry in self.entries.lock().values_mut() {
                    entry.next_at = now;
                }
                log::info!(
                    "{} changed; resolving backend names again",
                    self.settings.hosts_file.display()
                );
            }
            Err(e) => log::warn!("cannot reload the resolver: {e}"),
        }
    }
}

/// The resolver the settings describe, and the hosts file's modification time.
fn build_resolver(settings: &NameSettings) -> Result<(TokioResolver, Option<SystemTime>), String> {
    let (mut config, mut options) = match std::fs::read(&settings.resolv_conf) {
        Ok(mut data) => {
            // A file without nameservers (a container's, or one used with --dns-servers)
            // still gives search domains and options; the parser wants one, so it gets a
            // placeholder, replaced below.
            let has_nameserver = String::from_utf8_lossy(&data)
                .lines()
                .any(|line| line.trim_start().starts_with("nameserver"));
            if !has_nameserver {
                data.extend_from_slice(b"\nnameserver 127.0.0.1\n");
            }
            let (mut config, options) = hickory_resolver::system_conf::parse_resolv_conf(data)
                .map_err(|e| format!("{}: {e}", settings.resolv_conf.display()))?;
            if !has_nameserver && settings.servers.is_empty() {
                log::warn!(
                    "{} names no nameserver: backend names resolve from {} only",
                    settings.resolv_conf.display(),
                    settings.hosts_file.display()
                );
                config = ResolverConfig::from_parts(
                    config.domain().cloned(),
                    config.search().to_vec(),
                    NameServerConfigGroup::new(),
                );
            }
            (config, options)
        }
        Err(e) => {
            if settings.servers.is_empty() {
                log::warn!(
                    "cannot read {} ({e}): backend names resolve from {} only",
                    settings.resolv_conf.display(),
                    settings.hosts_file.display()
                );
            }
            (
                ResolverConfig::from_parts(None, Vec::new(), NameServerConfigGroup::new()),
                ResolverOpts::default(),
            )
        }
    };
    if !settings.servers.is_empty() {
        let mut servers = NameServerConfigGroup::new();
        for server in &settings.servers {
            servers.merge(NameServerConfigGroup::from_ips_clear(
                &[server.ip()],
                server.port(),
                true,
            ));
        }
        config =
            ResolverConfig::from_parts(config.domain().cloned(), config.search().to_vec(), servers);
    }
    options.timeout = settings.timeout;
    options.attempts = 1;
    // The hosts file is ours to read (and read again); the cache must not outlive our TTL
    // bounds, and a failure must be asked again at our pace, not the negative TTL's.
    options.use_hosts_file = ResolveHosts::Never;
    options.positive_max_ttl = Some(settings.max_ttl);
    options.negative_max_ttl = Some(settings.min_ttl);
    options.cache_size = 1024;
    let mut resolver =
        TokioResolver::builder_with_config(config, TokioConnectionProvider::default())
            .with_options(options)
            .build();
    let stamp = modified(&settings.hosts_file);
    let mut hosts = Hosts::default();
    if let Ok(file) = std::fs::File::open(&settings.hosts_file) {
        hosts
            .read_hosts_conf(file)
            .map_err(|e| format!("{}: {e}", settings.hosts_file.display()))?;
    }
    resolver.set_hosts(Arc::new(hosts));
    Ok((resolver, stamp))
}

fn modified(path: &std::path::Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// One resolution: the addresses (with SRV weights) and the time the answer holds.
async fn resolve(
    resolver: &TokioResolver,
    name: &BackendAddress,
    deadline: Duration,
) -> Result<(Vec<(SocketAddr, Option<u16>)>, Duration), String> {
    match name {
        BackendAddress::Ip(address) => Ok((vec![(*address, None)], Duration::MAX)),
        BackendAddress::Name { host, port } => {
            let lookup = resolver.lookup_ip(host.as_str()).await.map_err(describe)?;
            let ttl = lookup
                .valid_until()
                .saturating_duration_since(Instant::now());
            let addresses: Vec<(SocketAddr, Option<u16>)> = lookup
                .iter()
                .map(|ip| (SocketAddr::new(ip, *port), None))
                .collect();
            if addresses.is_empty() {
                return Err("no address".into());
            }
            Ok((addresses, ttl))
        }
        BackendAddress::Srv(srv) => {
            let lookup = resolver.srv_lookup(srv.as_str()).await.map_err(describe)?;
            let mut ttl = lookup
                .as_lookup()
                .valid_until()
                .saturating_duration_since(Instant::now());
            // Only the most preferred (lowest) priority is used, as RFC 2782 says; the
            // others are for when all of those are gone, which health checks cover.
            let Some(best) = lookup.iter().map(|r| r.priority()).min() else {
                return Err("no SRV record".into());
            };
            let records: Vec<_> = lookup
                .iter()
                .filter(|r| r.priority() == best)
                .take(MAX_SRV_TARGETS)
                .collect();
            let heaviest = records.iter().map(|r| r.weight()).max().unwrap_or(0);
            let mut addresses = Vec::new();
            let mut reasons = Vec::new();
            for record in records {
                // RFC 2782 weights are 0..=65535; ours are 1..=100, in proportion.
                let weight = if heaviest == 0 {
                    1
                } else {
                    (u32::from(record.weight()) * u32::from(MAX_WEIGHT) / u32::from(heaviest))
                        .max(1) as u16
                };
                let target = record.target().to_string();
                match tokio::time::timeout(deadline, resolver.lookup_ip(target.as_str())).await {
                    Ok(Ok(ips)) => {
                        ttl = ttl.min(ips.valid_until().saturating_duration_since(Instant::now()));
                        for ip in ips.iter() {
                            addresses.push((SocketAddr::new(ip, record.port()), Some(weight)));
                        }
                    }
                    Ok(Err(e)) => reasons.push(format!("{target}: {}", describe(e))),
                    Err(_) => reasons.push(format!("{target}: no answer within the deadline")),
                }
            }
            if addresses.is_empty() {
                return Err(format!("no target resolves: {}", reasons.join("; ")));
            }
            Ok((addresses, ttl))
        }
    }
}

fn describe(error: ResolveError) -> String {
    if error.is_nx_domain() {
        "no such name (NXDOMAIN)".into()
    } else if error.is_no_records_found() {
        "no records".into()
    } else {
        error.to_string()
    }
}
