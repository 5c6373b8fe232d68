//! `switchyard serve`: opens the store, builds the route cache and the router, starts the
//! listener's threads and the background tasks (change follower, health checks, certificate
//! expiry, ticket keys, admin API), and waits for a signal. SIGTERM and SIGQUIT stop
//! accepting and let the requests under way finish within the shutdown grace (SIGQUIT is
//! what an operator sends once a router started with `--upgrade` has taken the sockets
//! over); SIGINT stops at once.

use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use switchyard_admin::AdminState;
use switchyard_config::{AccessLogChoice, Config, PoolSched, StoreChoice, TlsConfig};
use switchyard_proxy::{
    AccessLog, AccessLogTarget, BackendNames, CacheRedis, CertCache, CertCacheLimits,
    CertExpiryScan, ChangeFollower, ConnectionDrain, ConnectionTable, FilterDefaults,
    FilterModules, FleetLimitSync, HealthChecker, InheritedSockets, Inspector, Listener,
    ListenerStop, ListenerTls, NameSettings, PoolScheduling, RequestBufferSettings, RequestBuffers,
    ResponseBuffers, RouteCache, RouteCacheLimits, Router, ServedCert, ShutdownWatch,
    SpoolSettings, TicketKeyRotation, TrafficHistory, UsageLedger, WorkerPool,
};
use switchyard_store::{EmbeddedStore, RedisStore, RedisTimeouts, Store};
use switchyard_tls_tickets::TicketKeys;
use switchyard_waf::RuleFiles;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use crate::admin_service::{
    serve_admin, serve_metrics, AuditToLogs, CacheRedisPurge, Changes, FilterCompile,
    FollowerProgress, NamesView, RouteExplainer, Traffic, WafReload,
};

/// At shutdown, how long undelivered access-log batches may take to reach the log service
/// before they are left in the spool for the next start.
const LOG_SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Ticket keys kept: the current one and the previous one, so a ticket stays usable for one
/// to two rotation intervals.
const TICKET_KEYS_KEPT: usize = 2;

/// How long a router started with `--upgrade` waits for the one it replaces to let go of
/// the embedded store and the admin port. The old router does so when it stops accepting,
/// on the SIGQUIT the operator sends once this one has taken the sockets over.
const HANDOVER_WAIT: Duration = Duration::from_secs(30);
const HANDOVER_POLL: Duration = Duration::from_millis(10);

/// Threads of the runtime that runs the background tasks: the change follower and the
/// admin API never wait behind a health-check round.
const BACKGROUND_THREADS: usize = 2;

/// How long the background tasks may take to end after a stop signal (a health check or a
/// store read under way) before the router goes on with its shutdown without them.
const TASKS_STOP_WAIT: Duration = Duration::from_secs(5);

/// How the router was asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// SIGTERM or SIGQUIT: stop accepting, let the requests under way finish.
    Graceful(&'static str),
    /// SIGINT: now.
    Fast,
}

/// The engine of apps' proxy-wasm filters, with the router's limits for them.
fn filter_modules(
    settings: &switchyard_config::FilterSettings,
) -> anyhow::Result<Arc<FilterModules>> {
    let defaults = FilterDefaults {
        deadline: settings.deadline,
        memory_bytes: usize::try_from(settings.memory_bytes).unwrap_or(usize::MAX),
        instances_per_thread: settings.instances_per_thread,
    };
    let modules = FilterModules::new(Some(settings.cache_dir.clone()), defaults)
        .map_err(anyhow::Error::msg)
        .context("cannot start the engine of apps' filters")?;
    Ok(Arc::new(modules))
}

/// What each app costs, as the settings say; before the event loops start, each reading
/// whether it meters its connections' polls.
fn account_usage(config: &Config) {
    switchyard_proxy::set_usage_top_apps(config.usage_top_apps);
    switchyard_proxy::set_cpu_attribution(config.cpu_attribution);
    switchyard_proxy::configure_fair_share(switchyard_proxy::FairShare {
        on: config.fair_share.on,
        lag_bound: config.fair_share.lag,
        queue_bound: config.fair_share.queue,
    });
    switchyard_proxy::register_app_costs();
}

/// The ledger of each app's usage by the minute (`GET /v1/usage`), kept by a task.
fn usage_ledger(tasks: &mut BackgroundTasks) -> Arc<UsageLedger> {
    let usage = Arc::new(UsageLedger::new());
    let kept = usage.clone();
    tasks.spawn(|watch| async move { kept.run(watch).await });
    usage
}

/// Runs the router until a signal ends it.
pub(crate) fn run(config: Config) -> anyhow::Result<()> {
    init_logging();
    // Read before anything is opened or bound: a wrong file is said at once.
    let admin_tls = match &config.admin_tls {
        Some(files) => Some(Arc::new(
            switchyard_admin::AdminTls::from_files(
                &files.cert,
                &files.key,
                files.client_ca.as_deref(),
            )
            .map_err(anyhow::Error::msg)?,
        )),
        None => None,
    };
    crate::limits::raise_open_file_limit();
    crate::limits::keep_memory_in_small_pages();
    account_usage(&config);
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create {}", config.data_dir.display()))?;
    let background = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(BACKGROUND_THREADS)
        .thread_name("background")
        .enable_all()
        .build()
        .context("cannot start the background runtime")?;
    // Signals are taken over before anything starts, so an early SIGTERM stops the router
    // cleanly instead of killing it half-started.
    let signals = background.block_on(async { Signals::new() })?;
    let (handover_wait, mut inherited_sockets) = listening_sockets(&config)?;
    let (store, embedded) = open_store(&config, handover_wait)?;
    let default_cert = load_default_cert(&config.tls)?;
    let admin_listener = bind_service(config.admin, handover_wait)
        .with_context(|| format!("cannot listen on the admin address {}", config.admin))?;
    let metrics_listener = config
        .metrics
        .map(|address| {
            bind_service(address, handover_wait)
                .with_context(|| format!("cannot listen for metrics on {address}"))
        })
        .transpose()?;

    let access_log = start_access_log(&config.access_log)?;
    let changes = store.subscribe();
    let backend_names = Arc::new(backend_names(&config)?);
    let filter_modules = filter_modules(&config.filters)?;
    let routes = Arc::new(
        RouteCache::new(
            store.clone(),
            RouteCacheLimits {
                apps: config.route_cache_apps,
                domains: config.route_cache_apps.saturating_mul(4),
                response_bytes: config.cache_memory_bytes,
            },
        )
        .with_backend_names(backend_names.clone())
        .with_filters(filter_modules.clone()),
    );
    let connections = Arc::new(ConnectionTable::new());
    let drain = Arc::new(ConnectionDrain::new(
        connections.clone(),
        routes.clone(),
        config.drain_grace,
    ));
    let cache_redis = match &config.cache_redis {
        Some((url, timeout)) => Some(Arc::new(
            CacheRedis::new(url, *timeout).map_err(anyhow::Error::msg)?,
        )),
        None => None,
    };
    let access_log_kept = access_log.clone();
    let https_port = config.https.and(config.tls.redirect_port);
    let router = Router::new(
        routes.clone(),
        connections,
        access_log,
        https_port,
        cache_redis.clone(),
    )
    .with_client_timeouts(config.client_timeouts)
    .with_limits(config.limit_clients, config.trusted_proxies.clone());
    let (router, fleet_limit_sync, inspector) = with_heavy_stages(router, &config)?;

    let mut tasks = BackgroundTasks::new(&background);
    let certs = match config.https {
        Some(_) => Some(start_tls(&config, &store, default_cert, &mut tasks)?),
        None => None,
    };
    let listener = start_listener(
        &config,
        &router,
        certs.as_ref(),
        &store,
        &mut inherited_sockets,
    )?;
    let certs = certs.map(|(certs, _)| certs);

    let mut follower = ChangeFollower::new(routes.clone(), certs, drain, changes)
        .with_backend_names(backend_names.clone());
    if let Some(inspector) = &inspector {
        follower = follower.with_waf(inspector.clone());
    }
    let follower_progress = FollowerProgress(follower.applied());
    let recent_changes = follower.recent_changes();
    tasks.spawn(|watch| async move { follower.run(watch).await });
    spawn_services(
        &config,
        &mut tasks,
        &store,
        fleet_limit_sync,
        &backend_names,
        &routes,
    )?;
    let explainer = RouteExplainer {
        routes: routes.clone(),
        cache_redis: cache_redis.clone(),
    };
    let history = Arc::new(TrafficHistory::new(config.history_max_apps));
    {
        let history = history.clone();
        tasks.spawn(|watch| async move { history.run(watch).await });
    }
    let usage = usage_ledger(&mut tasks);
    tasks.spawn(switchyard_proxy::sample_fair_shares);
    let metrics_store = store.clone();
    let mut admin_state = AdminState::new(store, config.admin_token.clone())
        .with_local_caches(Arc::new(follower_progress))
        .with_backend_names(Arc::new(NamesView(backend_names)))
        .with_explainer(Arc::new(explainer))
        .with_traffic(Arc::new(Traffic(history, usage)))
        .with_change_log(Arc::new(Changes(recent_changes)))
        .with_ui_writes(config.admin_ui_writes)
        .with_audit_retention(config.audit_retention)
        .with_audit_sink(Arc::new(AuditToLogs(access_log_kept.clone())))
        .with_filter_check(Arc::new(FilterCompile(filter_modules)));
    if let Some(cache_redis) = cache_redis {
        admin_state = admin_state.with_shared_cache(Arc::new(CacheRedisPurge(cache_redis)));
    }
    if let Some(inspector) = inspector {
        admin_state = admin_state.with_waf(Arc::new(WafReload(inspector)));
    }
    tasks.spawn(|watch| serve_admin(admin_listener, admin_state, admin_tls, watch));
    if let Some(listener) = metrics_listener {
        tasks.spawn(|watch| serve_metrics(listener, metrics_store, watch));
    }

    log_serving(&config);
    crate::service_manager::notify(&format!(
        "READY=1\nMAINPID={}\nSTATUS=serving",
        std::process::id()
    ));
    let stop = background.block_on(signals.next(|signal| {
        log::info!("{signal}: reopening the access log");
        access_log_kept.reopen();
    }));
    stop_serving(stop, &config, tasks, &listener, embedded);
    // Every request has finished: what the access log still holds is delivered or spooled.
    access_log_kept.finish(LOG_SHUTDOWN_GRACE);
    background.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

/// The listening sockets, taken over or bound, started on their threads. One
/// single-threaded runtime per thread, each with its own SO_REUSEPORT listening sockets, as
/// nginx's workers: each keeps its own idle backend connections, so a connection is only
/// ever taken again by the thread whose runtime watches it (bench/ENGINE.md). Routes,
/// caches, limits and logs are shared.
fn start_listener(
    config: &Config,
    router: &Router,
    certs: Option<&(Arc<CertCache>, Arc<TicketKeys>)>,
    store: &Arc<dyn Store>,
    inherited_sockets: &mut InheritedSockets,
) -> anyhow::Result<ListenerStop> {
    let mut listener = Listener::new(config.threads)
        .listen_http(config.http, inherited_sockets)
        .with_context(|| format!("cannot listen for http on {}", config.http))?;
    if let (Some(address), Some((certs, tickets))) = (config.https, certs) {
        let tls = ListenerTls::new(certs.clone(), tickets.clone(), store.clone())
            .map_err(anyhow::Error::msg)?;
        listener = listener
            .listen_https(address, tls, inherited_sockets)
            .with_context(|| format!("cannot listen for https on {address}"))?;
    }
    if let (Some(address), Some((certs, _))) = (config.http3, certs) {
        listener = listener
            .listen_http3(
                address,
                certs.clone(),
                inherited_sockets,
                config.http3_early_data,
            )
            .with_context(|| format!("cannot listen for http/3 on {address} (udp)"))?;
        switchyard_proxy::advertise_http3(address.port());
    }
    for address in inherited_sockets.unused() {
        log::warn!("taken over a socket on {address}, where this router does not listen: closed");
    }
    listener
        .start(router, &config.data_dir)
        .context("cannot start the listener")
}

/// The background services that follow the store and the backends: the store's change
/// feed, the affinity key, the fleet's rate sync, the names' resolution, the health
/// checks and the ACME issuer.
fn spawn_services(
    config: &Config,
    tasks: &mut BackgroundTasks<'_>,
    store: &Arc<dyn Store>,
    fleet_limit_sync: Option<FleetLimitSync>,
    backend_names: &Arc<BackendNames>,
    routes: &Arc<RouteCache>,
) -> anyhow::Result<()> {
    {
        let (store, stopped) = (store.clone(), tasks.stopped());
        tasks.spawn(|_| async move { store.follow_changes(Box::pin(stopped)).await });
    }
    {
        let (store, stopped) = (store.clone(), tasks.stopped());
        tasks.spawn(|_| async move {
            tokio::select! {
                () = load_affinity_key(store) => {}
                () = stopped => {}
            }
        });
    }
    if let Some(sync) = fleet_limit_sync {
        let (interval, stopped) = (config.limit_sync, tasks.stopped());
        tasks.spawn(|_| async move { sync.run(interval, stopped).await });
    }
    {
        let (names, routes) = (backend_names.clone(), routes.clone());
        let still_uses = move |app: &str, name: &_| routes.uses_backend(app, name);
        tasks.spawn(|watch| async move { names.run(still_uses, watch).await });
    }
    let health = HealthChecker::new(routes.clone());
    tasks.spawn(|watch| async move { health.run(watch).await });
    if let Some(settings) = config.acme.clone() {
        let issuer = switchyard_acme::Issuer::new(settings, store.clone())
            .map_err(anyhow::Error::msg)
            .context("cannot start the ACME issuer")?;
        let stopped = tasks.stopped();
        tasks.spawn(|_| issuer.run(stopped));
    }
    Ok(())
}

fn log_serving(config: &Config) {
    let or_off =
        |address: Option<SocketAddr>| address.map_or_else(|| "off".to_string(), |a| a.to_string());
    log::info!(
        "switchyard serving: http on {}, https on {}, http/3 on {}, admin on {}, metrics on {}, store {:?} in {}",
        config.http,
        or_off(config.https),
        or_off(config.http3),
        config.admin,
        or_off(config.metrics),
        config.store,
        config.data_dir.display(),
    );
}

/// Ends the router as `stop` asks: at once, or after the requests under way finish.
fn stop_serving(
    stop: Stop,
    config: &Config,
    tasks: BackgroundTasks<'_>,
    listener: &ListenerStop,
    embedded: Option<EmbeddedStore>,
) {
    if stop != Stop::Graceful("SIGQUIT") {
        // SIGQUIT is a hand-over: the unit goes on in the router taking over.
        crate::service_manager::notify("STOPPING=1");
    }
    match stop {
        Stop::Fast => log::info!("SIGINT: stopping now"),
        Stop::Graceful(name) => {
            log::info!(
                "{name}: no longer accepting; requests under way have {:?} to finish",
                config.shutdown_grace
            );
            tasks.tell_to_stop();
            stop_accepting(listener, embedded);
            // The background tasks end on the signal (the admin port is let go of for the
            // router taking over); then the connections still open get the grace period.
            tasks.wait();
            let finished = listener.wait_finished(config.shutdown_grace);
            if !finished {
                log::info!("shutdown grace over: closing the connections still open");
            }
        }
    }
}

/// The tasks on the background runtime, each told by the same watch to stop.
struct BackgroundTasks<'a> {
    runtime: &'a tokio::runtime::Runtime,
    stop: watch::Sender<bool>,
    handles: Vec<tokio::task::JoinHandle<()>>,
}

impl<'a> BackgroundTasks<'a> {
    fn new(runtime: &'a tokio::runtime::Runtime) -> Self {
        Self {
            runtime,
            stop: watch::channel(false).0,
            handles: Vec::new(),
        }
    }

    /// Starts the task `start` makes from the stop watch.
    fn spawn<F>(&mut self, start: impl FnOnce(ShutdownWatch) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let task = start(self.stop.subscribe());
        self.handles.push(self.runtime.spawn(task));
    }

    /// A future that ends once the tasks are told to stop, for tasks that take one.
    fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut watch = self.stop.subscribe();
        async move {
            let _ = watch.changed().await;
        }
    }

    fn tell_to_stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Waits, within [`TASKS_STOP_WAIT`], for every task to end.
    fn wait(self) {
        let handles = self.handles;
        let ended = self.runtime.block_on(async {
            tokio::time::timeout(TASKS_STOP_WAIT, async {
                for task in handles {
                    let _ = task.await;
                }
            })
            .await
        });
        if ended.is_err() {
            log::warn!("background tasks still running {TASKS_STOP_WAIT:?} after the signal");
        }
    }
}

/// How long to wait for a router being replaced to let go of what it holds, and the
/// sockets taken over from it (`--upgrade`); otherwise no wait, no sockets, and the
/// addresses checked free so a taken port is a clear error at start-up.
fn listening_sockets(config: &Config) -> anyhow::Result<(Duration, InheritedSockets)> {
    if !config.upgrade {
        ensure_bindable(config.http, "http")?;
        if let Some(https) = config.https {
            ensure_bindable(https, "https")?;
        }
        return Ok((Duration::ZERO, InheritedSockets::default()));
    }
    // The new process takes the running one's listening sockets at once, from the offer
    // the running one keeps open, and says so in its log: the operator's cue for SIGQUIT,
    // on which the running one stops accepting. Connections queue on the shared sockets
    // meanwhile.
    let taken = InheritedSockets::take_over_required(&config.data_dir)
        .context("cannot take over the running router's sockets (--upgrade)")?;
    log::info!(
        "took over {} listening sockets from the running router; it may be sent SIGQUIT",
        taken.count()
    );
    if config.quit_predecessor {
        quit_predecessor(&taken)?;
    }
    Ok((HANDOVER_WAIT, taken))
}

/// Sends the router taken over from SIGQUIT (`--quit-predecessor`), this process having
/// told the service manager first that it is the unit's main process now: the old one may
/// exit before this one is ready, and systemd would otherwise take that for the service's
/// end and stop this one with it.
fn quit_predecessor(taken: &InheritedSockets) -> anyhow::Result<()> {
    let pid = taken.predecessor().context(
        "the running router did not say which process it is (--quit-predecessor): \
         send it SIGQUIT by hand",
    )?;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).context("a process id")?);
    crate::service_manager::notify(&format!("MAINPID={}", std::process::id()));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGQUIT)
        .with_context(|| format!("cannot send SIGQUIT to the running router ({pid})"))?;
    log::info!("sent SIGQUIT to the router taken over from ({pid})");
    Ok(())
}

/// The store, and the embedded one again when it is that (it is closed apart, at
/// shutdown, for a router taking over).
/// Reads the fleet's sticky-session key from the store (the first router of a fleet makes
/// it), retrying while the store is away: until it comes, apps with affinity are balanced
/// and set no cookie.
async fn load_affinity_key(store: Arc<dyn Store>) {
    let mut candidate = [0u8; 32];
    if let Err(e) = openssl::rand::rand_bytes(&mut candidate) {
        log::error!("no random bytes for the affinity key ({e}): sticky sessions stay off");
        return;
    }
    let candidate: String = candidate.iter().map(|b| format!("{b:02x}")).collect();
    loop {
        match store.fleet_secret("affinity", candidate.clone()).await {
            Ok(secret) => {
                switchyard_proxy::set_affinity_key(&secret);
                return;
            }
            Err(e) => {
                log::warn!("cannot read the affinity key from the store ({e}); retrying in 2 s");
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
        }
    }
}

fn open_store(
    config: &Config,
    handover_wait: Duration,
) -> anyhow::Result<(Arc<dyn Store>, Option<EmbeddedStore>)> {
    match &config.store {
        StoreChoice::Embedded => {
            let store = EmbeddedStore::open_when_released(&config.data_dir, handover_wait)
                .with_context(|| {
                    format!("cannot open the store in {}", config.data_dir.display())
                })?;
            Ok((Arc::new(store.clone()), Some(store)))
        }
        StoreChoice::Redis { url, timeout, acks } => {
            // Not connected here: a router must come up (and serve what it can) while Redis
            // is away, and connect when it returns.
            let redis = RedisStore::new(
                url,
                RedisTimeouts {
                    operation: *timeout,
                    connect: *timeout,
                    // `WAIT` for the replicas of a write.
                    blocking: acks.timeout,
                },
            )?
            .with_write_acks(*acks);
            Ok((Arc::new(redis), None))
        }
    }
}

fn backend_names(config: &Config) -> anyhow::Result<BackendNames> {
    BackendNames::new(NameSettings {
        min_ttl: config.dns.min_ttl,
        max_ttl: config.dns.max_ttl,
        timeout: config.dns.timeout,
        max_names: config.dns.max_names,
        resolv_conf: config.dns.resolv_conf.clone(),
        hosts_file: config.dns.hosts_file.clone(),
        servers: config.dns.servers.clone(),
    })
    .map_err(anyhow::Error::msg)
    .context("cannot set up the resolver of backend names")
}

/// The router with what costs CPU or memory beyond a request's own: fleet-wide rates
/// (with a Redis store), the worker pool for the WAF and images, response buffering,
/// and the WAF when it is on.
/// Where a benchmark asks heavy work to run for a comparison.
enum BenchmarkPool {
    /// On the event loop that took the request: what a router without a pool does.
    Inline,
    /// On the pool's threads, scheduled so.
    Scheduled(PoolScheduling),
}

/// The environment variable through which the benchmarks compare the worker pool with what
/// a router without its CPU isolation would do (bench/bench_waf.py, bench/bench_images.py):
/// `inline`, or the pool's threads scheduled `idle-kernel` (SCHED_IDLE alone, the default
/// before), `nice` or `pinned` (nice 10 on the last core). Kept out of the settings: no flag,
/// file key or help text offers a router that serves the first or the last.
const BENCHMARK_POOL: &str = "SWITCHYARD_BENCH_POOL";

/// The pool as `--pool-sched` configures it, unless a benchmark asks for a comparison.
fn benchmark_pool(configured: PoolScheduling) -> anyhow::Result<BenchmarkPool> {
    let Ok(asked) = std::env::var(BENCHMARK_POOL) else {
        return Ok(BenchmarkPool::Scheduled(configured));
    };
    Ok(match asked.as_str() {
        "inline" => BenchmarkPool::Inline,
        "idle-kernel" => BenchmarkPool::Scheduled(PoolScheduling::IdleKernel),
        "nice" => BenchmarkPool::Scheduled(PoolScheduling::Nice),
        "pinned" => BenchmarkPool::Scheduled(PoolScheduling::Pinned),
        other => anyhow::bail!(
            "{BENCHMARK_POOL}={other:?}: expected `inline`, `idle-kernel`, `nice` or `pinned`"
        ),
    })
}

fn with_heavy_stages(
    mut router: Router,
    config: &Config,
) -> anyhow::Result<(Router, Option<FleetLimitSync>, Option<Arc<Inspector>>)> {
    // With a Redis store, apps may count their rate across the fleet through it.
    let mut fleet_limit_sync = None;
    if let StoreChoice::Redis { url, .. } = &config.store {
        let (with_fleet, sync) = router.with_fleet_limits(url).map_err(anyhow::Error::msg)?;
        router = with_fleet;
        fleet_limit_sync = Some(sync);
    }
    // One pool for every CPU-heavy stage (WAF, images): its threads sleep until used.
    let configured = match config.pool_sched {
        PoolSched::Idle => PoolScheduling::Idle,
        PoolSched::Nice => PoolScheduling::Nice,
    };
    let pool = Arc::new(match benchmark_pool(configured)? {
        BenchmarkPool::Inline => WorkerPool::inline(config.pool_threads),
        BenchmarkPool::Scheduled(scheduling) => {
            WorkerPool::new(config.pool_threads, config.pool_queue, scheduling)
                .context("cannot start the worker pool")?
        }
    });
    router = router.with_worker_pool(pool.clone());
    let response_spool = config.data_dir.join("response-spool");
    std::fs::create_dir_all(&response_spool).with_context(|| {
        format!(
            "cannot make the response spool {}",
            response_spool.display()
        )
    })?;
    router = router.with_response_buffers(ResponseBuffers::new(
        config.response_buffer_bytes,
        config.response_buffer_memory_bytes,
        config.response_spool_bytes,
        response_spool,
    ));
    let request_spool = config.data_dir.join("request-spool");
    std::fs::create_dir_all(&request_spool)
        .with_context(|| format!("cannot make the request spool {}", request_spool.display()))?;
    let buffering = &config.request_buffering;
    router = router.with_request_buffers(RequestBuffers::new(RequestBufferSettings {
        per_request_bytes: buffering.per_request_bytes,
        memory_bytes: buffering.memory_bytes,
        spool_bytes: buffering.spool_bytes,
        spool_dir: request_spool,
        min_rate: buffering.min_rate,
        grace: buffering.grace,
        deadline: buffering.deadline,
    }));
    if !config.waf {
        return Ok((router, fleet_limit_sync, None));
    }
    let inspector = Arc::new(load_waf(config, pool)?);
    router = router.with_waf(inspector.clone());
    Ok((router, fleet_limit_sync, Some(inspector)))
}

fn load_waf(config: &Config, pool: Arc<WorkerPool>) -> anyhow::Result<Inspector> {
    let started = std::time::Instant::now();
    let files = RuleFiles {
        extra: config.waf_rules.clone(),
        ..RuleFiles::default()
    };
    let spool = SpoolSettings {
        dir: config.data_dir.join("waf-spool"),
        budget_bytes: config.waf_spool_bytes,
    };
    std::fs::create_dir_all(&spool.dir)
        .with_context(|| format!("cannot make the WAF spool {}", spool.dir.display()))?;
    let inspector = Inspector::load(files, pool, spool).with_context(|| {
        "cannot load the WAF (libmodsecurity with the OWASP Core Rule Set from Debian's \
         modsecurity-crs, and --waf-rules if given); fix it or start with --waf off"
    })?;
    log::info!(
        "WAF: OWASP Core Rule Set loaded in {:?}, {} rules",
        started.elapsed(),
        inspector.rule_count()
    );
    Ok(inspector)
}

/// The certificate cache and the session-ticket keys of the HTTPS listener, with the
/// tasks that rotate the keys and scan for expiring certificates.
fn start_tls(
    config: &Config,
    store: &Arc<dyn Store>,
    default_cert: Option<ServedCert>,
    tasks: &mut BackgroundTasks<'_>,
) -> anyhow::Result<(Arc<CertCache>, Arc<TicketKeys>)> {
    let certs = Arc::new(CertCache::new(
        store.clone(),
        CertCacheLimits {
            certificates: config.tls.cert_cache_size,
            absent_names: config.tls.cert_cache_size.saturating_mul(10),
            ..CertCacheLimits::default()
        },
        default_cert,
    ));
    let tickets =
        TicketKeys::new(TICKET_KEYS_KEPT).context("cannot create TLS session-ticket keys")?;
    let rotation = TicketKeyRotation::new(tickets.clone(), config.tls.ticket_rotation);
    let expiry = CertExpiryScan::new(store.clone(), config.tls.expiry_scan);
    tasks.spawn(|watch| async move { rotation.run(watch).await });
    tasks.spawn(|watch| async move { expiry.run(watch).await });
    Ok((certs, tickets))
}

/// Stops the listener from accepting, and lets go of the embedded store so a router taking
/// over (`--upgrade`) can open it while this one finishes its requests. Closing the store
/// writes redb's allocator state and syncs: done here, on the main thread, no event loop's.
fn stop_accepting(listener: &ListenerStop, store: Option<EmbeddedStore>) {
    listener.stop();
    if let Some(store) = store {
        store.release();
        log::info!("store released for the next router process");
    }
}

/// The signals that stop the router, taken from their default (exit at once).
struct Signals {
    terminate: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
    /// SIGHUP and SIGUSR1 reopen the files the router writes, as nginx's USR1 and
    /// logrotate's `postrotate kill -HUP` habit expect; neither ends the process.
    hangup: tokio::signal::unix::Signal,
    user1: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        let take = |kind: SignalKind| signal(kind).context("cannot install a signal handler");
        Ok(Self {
            terminate: take(SignalKind::terminate())?,
            quit: take(SignalKind::quit())?,
            interrupt: take(SignalKind::interrupt())?,
            hangup: take(SignalKind::hangup())?,
            user1: take(SignalKind::user_defined1())?,
        })
    }

    /// The signal that stops the router; `reopen` is called on each SIGHUP or SIGUSR1
    /// until then.
    async fn next(mut self, reopen: impl Fn(&str)) -> Stop {
        loop {
            tokio::select! {
                _ = self.terminate.recv() => return Stop::Graceful("SIGTERM"),
                _ = self.quit.recv() => return Stop::Graceful("SIGQUIT"),
                _ = self.interrupt.recv() => return Stop::Fast,
                _ = self.hangup.recv() => reopen("SIGHUP"),
                _ = self.user1.recv() => reopen("SIGUSR1"),
            }
        }
    }
}

fn load_default_cert(tls: &TlsConfig) -> anyhow::Result<Option<ServedCert>> {
    let Some((cert_path, key_path)) = &tls.default_cert else {
        return Ok(None);
    };
    let read = |path: &std::path::Path| {
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
    };
    let cert = ServedCert::from_pem(&read(cert_path)?, &read(key_path)?).map_err(|e| {
        anyhow::anyhow!(
            "default certificate {} / {}: {e}",
            cert_path.display(),
            key_path.display()
        )
    })?;
    switchyard_proxy::watch_default_cert(&cert);
    Ok(Some(cert))
}

/// The listening socket of a service on the background runtime, non-blocking, bound as
/// [`bind_when_released`] binds.
fn bind_service(address: SocketAddr, wait: Duration) -> std::io::Result<TcpListener> {
    let listener = bind_when_released(address, wait)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Binds `address`, waiting up to `wait` while another process (the router this one
/// replaces) still holds it.
fn bind_when_released(address: SocketAddr, wait: Duration) -> std::io::Result<TcpListener> {
    let started = Instant::now();
    loop {
        match TcpListener::bind(address) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && started.elapsed() < wait => {
                std::thread::sleep(HANDOVER_POLL);
            }
            bound => return bound,
        }
    }
}

fn ensure_bindable(address: SocketAddr, name: &str) -> anyhow::Result<()> {
    TcpListener::bind(address)
        .map(drop)
        .with_context(|| format!("cannot listen on the {name} address {address}"))
}

fn start_access_log(choice: &AccessLogChoice) -> anyhow::Result<AccessLog> {
    let target = match choice {
        AccessLogChoice::Local(setting) => match setting.as_str() {
            "off" => AccessLogTarget::Off,
            "stdout" | "-" => AccessLogTarget::Stdout,
            path => AccessLogTarget::File(PathBuf::from(path)),
        },
        AccessLogChoice::Ship(config) => AccessLogTarget::Ship(config.clone()),
    };
    AccessLog::start(target).with_context(|| match choice {
        AccessLogChoice::Local(setting) => format!("cannot open the access log '{setting}'"),
        AccessLogChoice::Ship(_) => "cannot start shipping access logs".to_string(),
    })
}

fn init_logging() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        // aide marks every step of building the OpenAPI document as a tracing span, which
        // tracing (its `log` feature is on for quinn) writes out at info; not the
        // operator's business, whatever RUST_LOG says.
        .filter_module("tracing::span", log::LevelFilter::Warn)
        .filter_module("aide", log::LevelFilter::Warn)
        .target(env_logger::Target::Stderr)
        .init();
}
