//! `switchyard serve`: opens the store, builds the route cache and the router, and hands
//! them to a Pingora server together with the background services (change follower, health
//! checks, admin API). Pingora owns signals: SIGTERM stops accepting, lets in-flight
//! requests finish for the shutdown grace period, then exits.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use pingora::apps::HttpServerOptions;
use pingora::listeners::{L4BufferSettings, ListenerConfig, TcpSocketOptions};
use pingora::proxy::HttpProxy;
use pingora::server::configuration::ServerConf;
use pingora::server::{RunArgs, Server};
use pingora::services::background::background_service;
use pingora::services::listening::Service;
use switchyard_admin::AdminState;
use switchyard_config::{AccessLogChoice, Config, Engine, StoreChoice, TlsConfig};
use switchyard_proxy::{
    https_settings, AccessLog, AccessLogTarget, CacheRedis, CertCache, CertCacheLimits,
    CertExpiryScan, ChangeFollower, ConnectionDrain, ConnectionTable, HeadDeadline, HealthChecker,
    HyperListener, HyperListenerStop, HyperTls, InheritedSockets, Inspector, RouteCache,
    RouteCacheLimits, Router, ServedCert, SpoolSettings, TicketKeyRotation, WorkerPool,
};
use switchyard_store::{EmbeddedStore, RedisStore, RedisTimeouts, Store};
use switchyard_tls_tickets::TicketKeys;
use switchyard_waf::RuleFiles;

use crate::admin_service::{AdminService, CacheRedisPurge, FollowerProgress, WafReload};

/// Bytes a client connection buffers before a write reaches the socket. Pingora's default
/// (one MSS, 1,460) sends a response head alone whenever the body is larger, so a typical
/// page leaves in two segments and two syscalls; 8 KiB lets head and body of most pages go
/// together (cache hits of a 5 KB page: about +25% throughput, `bench/bench_cache.py`).
/// Chunked, upgraded and close-delimited bodies are still flushed on every write, so
/// streaming is not delayed.
const CLIENT_WRITE_BUFFER: usize = 8 * 1024;

/// Bytes a TLS client connection reads at a time ahead of OpenSSL, which otherwise asks the
/// socket for each record's 5-byte header and then its body, two reads a record. Pingora's
/// default, 64 KiB, is zero-filled for every connection, idle keep-alive ones and WebSockets
/// included; 16 KiB takes a whole record in one read.
const TLS_CLIENT_READ_BUFFER: usize = 16 * 1024;

/// A cleartext client connection reads with no buffer ahead of the parser: Pingora reads a
/// request head straight into its own head buffer and a body straight into the body's, so a
/// read-ahead buffer only added a zero-filled allocation, and a copy, per connection.
const CLEARTEXT_CLIENT_READ_BUFFER: usize = 0;

/// At shutdown, how long undelivered access-log batches may take to reach the log service
/// before they are left in the spool for the next start.
const LOG_SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Ticket keys kept: the current one and the previous one, so a ticket stays usable for one
/// to two rotation intervals.
const TICKET_KEYS_KEPT: usize = 2;

/// Thread `thread`'s own listening socket on `address`, in the SO_REUSEPORT group of all
/// threads: the kernel spreads new connections over them, and no thread wakes for another's.
/// Its connections read `read_buffer` bytes ahead of the parser.
fn thread_listener(address: SocketAddr, thread: usize, read_buffer: usize) -> ListenerConfig {
    let mut options = TcpSocketOptions::default();
    options.so_reuseport = Some(true);
    ListenerConfig::tcp(thread_listen_key(address, thread))
        .tcp_socket_options(options)
        .l4_buffer(L4BufferSettings::new(read_buffer, CLIENT_WRITE_BUFFER))
}

/// `address` spelled differently for each thread: Pingora keys the listening sockets it
/// hands to an upgraded router by the address as written, and two listeners written alike
/// would share one socket (and close it twice; cloudflare/pingora PR #990 proposes a proper
/// key). Zeros before the port change the spelling, not the address.
fn thread_listen_key(address: SocketAddr, thread: usize) -> String {
    let host = match address {
        SocketAddr::V4(v4) => v4.ip().to_string(),
        SocketAddr::V6(v6) => format!("[{}]", v6.ip()),
    };
    format!("{host}:{}{}", "0".repeat(thread), address.port())
}

/// How long a router started with `--upgrade` waits for the one it replaces to let go of
/// the embedded store and the admin port. The old router does so when it stops accepting,
/// which Pingora schedules 5 s after it has sent its listeners.
const HANDOVER_WAIT: Duration = Duration::from_secs(30);
const HANDOVER_POLL: Duration = Duration::from_millis(10);

/// Runs the router until a signal ends it.
pub(crate) fn run(config: Config) -> anyhow::Result<()> {
    init_logging();
    crate::limits::raise_open_file_limit();
    crate::limits::keep_memory_in_small_pages();
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create {}", config.data_dir.display()))?;
    let handover_wait = if config.upgrade {
        HANDOVER_WAIT
    } else {
        // Listeners are checked before anything starts, so a taken port is a clear error
        // at start-up rather than a panic inside a service.
        ensure_bindable(config.http, "http")?;
        if let Some(https) = config.https {
            ensure_bindable(https, "https")?;
        }
        if let Some(http_hyper) = config.http_hyper {
            ensure_bindable(http_hyper, "http_hyper")?;
        }
        if let Some(https_hyper) = config.https_hyper {
            ensure_bindable(https_hyper, "https_hyper")?;
        }
        Duration::ZERO
    };
    // On the hyper engine a new process takes the running one's listening sockets at once,
    // from the offer the running one keeps open, and says so in its log: the operator's cue
    // for SIGQUIT, on which the running one stops accepting (Pingora has no socket of its
    // own to hand over then). Connections queue on the shared sockets meanwhile.
    let taken_at_start = if config.upgrade && config.engine == Engine::Hyper {
        let taken = InheritedSockets::take_over_required(&config.data_dir)
            .context("cannot take over the running router's sockets (--upgrade)")?;
        log::info!(
            "took over {} listening sockets from the running router; it may be sent SIGQUIT",
            taken.count()
        );
        Some(taken)
    } else {
        None
    };
    let options = pingora::server::configuration::Opt {
        upgrade: config.upgrade && config.engine == Engine::Pingora,
        ..Default::default()
    };
    let mut server = Server::new_with_opt_and_conf(Some(options), server_conf(&config));
    // On Pingora, with --upgrade this waits for the running router's listening sockets (it
    // sends them on SIGQUIT): from here on no connection is refused, they queue until this
    // one accepts.
    server.bootstrap();
    // Taking over on Pingora: the running router's hyper sockets too, now, while it still
    // offers them (its shutdown, which withdraws them, begins a few seconds after it sent
    // Pingora's), so that nothing it queued on them is lost.
    let mut inherited_sockets = match taken_at_start {
        Some(taken) => taken,
        None if config.upgrade => InheritedSockets::take_over(&config.data_dir)
            .context("cannot take over the hyper listener's sockets")?,
        None => InheritedSockets::default(),
    };

    let mut redis_follower = None;
    let mut embedded = None;
    let store: Arc<dyn Store> = match &config.store {
        StoreChoice::Embedded => {
            let store = EmbeddedStore::open_when_released(&config.data_dir, handover_wait)
                .with_context(|| {
                    format!("cannot open the store in {}", config.data_dir.display())
                })?;
            embedded = Some(store.clone());
            Arc::new(store)
        }
        StoreChoice::Redis { url, timeout } => {
            // Not connected here: a router must come up (and serve what it can) while Redis
            // is away, and connect when it returns.
            let redis = RedisStore::new(
                url,
                RedisTimeouts {
                    operation: *timeout,
                    connect: *timeout,
                },
            )?;
            redis_follower = Some(redis.clone());
            Arc::new(redis)
        }
    };
    let default_cert = load_default_cert(&config.tls)?;
    let admin_listener = bind_when_released(config.admin, handover_wait)
        .with_context(|| format!("cannot listen on the admin address {}", config.admin))?;
    admin_listener.set_nonblocking(true)?;

    let access_log = start_access_log(&config.access_log)?;
    let changes = store.subscribe();
    let routes = Arc::new(RouteCache::new(
        store.clone(),
        RouteCacheLimits {
            apps: config.route_cache_apps,
            domains: config.route_cache_apps.saturating_mul(4),
            response_bytes: config.cache_memory_bytes,
        },
    ));
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
    let mut server_options = HttpServerOptions::default();
    server_options.h2c = true;
    let https_port = config.https.and(config.tls.redirect_port);
    // Both listeners are served by the same threads; each request learns from its
    // connection whether it came over TLS.
    let shutdown_log = access_log.clone();
    let mut router = Router::new(
        routes.clone(),
        connections,
        access_log,
        https_port,
        cache_redis.clone(),
    )
    .with_client_timeouts(config.client_timeouts);
    let stopping = router.stopping();
    // One pool for every CPU-heavy stage (WAF, images): its threads sleep until used.
    let pool = Arc::new(if config.pool_inline {
        WorkerPool::inline(config.pool_threads)
    } else {
        WorkerPool::new(config.pool_threads, config.pool_queue)
            .context("cannot start the worker pool")?
    });
    router = router.with_worker_pool(pool.clone());
    let inspector = if config.waf {
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
        let inspector = Arc::new(inspector);
        router = router.with_waf(inspector.clone());
        Some(inspector)
    } else {
        None
    };
    // The addresses the hyper listener serves: `http` and `https` on the hyper engine, and
    // with Pingora's only the side-by-side ones asked for.
    let (hyper_http, hyper_https) = match config.engine {
        Engine::Hyper => (Some(config.http), config.https),
        Engine::Pingora => (config.http_hyper, config.https_hyper),
    };
    let certs = match config.https.or(config.https_hyper) {
        Some(_) => {
            let certs = Arc::new(CertCache::new(
                store.clone(),
                CertCacheLimits {
                    certificates: config.tls.cert_cache_size,
                    absent_names: config.tls.cert_cache_size.saturating_mul(10),
                    ..CertCacheLimits::default()
                },
                default_cert,
            ));
            let tickets = TicketKeys::new(TICKET_KEYS_KEPT)
                .context("cannot create TLS session-ticket keys")?;
            server.add_service(background_service(
                "tls ticket keys",
                TicketKeyRotation::new(tickets.clone(), config.tls.ticket_rotation),
            ));
            server.add_service(background_service(
                "certificate expiry",
                CertExpiryScan::new(store.clone(), config.tls.expiry_scan),
            ));
            Some((certs, tickets))
        }
        None => None,
    };
    // One single-threaded service per thread, each with its own SO_REUSEPORT listening
    // sockets, as nginx's workers: each keeps its own idle backend connections, so a
    // connection is only ever taken again by the thread whose runtime watches it
    // (bench/ENGINE.md: one shared pool re-opened a backend connection every ~20 requests,
    // this opens fewer than nginx). Routes, caches, limits and logs are shared.
    let hyper_listener = if hyper_http.is_some() || hyper_https.is_some() {
        let inherited = &mut inherited_sockets;
        let mut listener = HyperListener::new(config.threads);
        if let Some(address) = hyper_http {
            listener = listener
                .listen_http(address, inherited)
                .with_context(|| format!("cannot listen for http on {address}"))?;
        }
        if let (Some(address), Some((certs, tickets))) = (hyper_https, &certs) {
            let tls = HyperTls::new(certs.clone(), tickets.clone()).map_err(anyhow::Error::msg)?;
            listener = listener
                .listen_https(address, tls, inherited)
                .with_context(|| format!("cannot listen for https on {address}"))?;
        }
        Some(
            listener
                .start(&router, &config.data_dir)
                .context("cannot start the hyper listener")?,
        )
    } else {
        None
    };
    for address in inherited_sockets.unused() {
        log::warn!("taken over a socket on {address}, where this router does not listen: closed");
    }
    // The Pingora engine's listeners: one service per thread, each with its own router.
    let pingora_routers: Vec<Router> = match config.engine {
        Engine::Hyper => Vec::new(),
        Engine::Pingora => {
            let others: Vec<Router> = (1..config.threads)
                .map(|_| router.for_another_thread())
                .collect();
            std::iter::once(router).chain(others).collect()
        }
    };
    for (thread, router) in pingora_routers.into_iter().enumerate() {
        let mut http_proxy = HttpProxy::new(router, server.configuration.clone());
        http_proxy.server_options = Some(server_options.clone());
        http_proxy.handle_init_modules();
        let mut proxy = Service::new(
            format!("switchyard proxy {thread}"),
            HeadDeadline::new(http_proxy, config.client_timeouts.header),
        );
        proxy.threads = Some(1);
        proxy.add_listener(thread_listener(
            config.http,
            thread,
            CLEARTEXT_CLIENT_READ_BUFFER,
        ));
        if let (Some(https), Some((certs, tickets))) = (config.https, &certs) {
            let settings =
                https_settings(certs.clone(), tickets.clone()).map_err(anyhow::Error::msg)?;
            proxy
                .add_listener(thread_listener(https, thread, TLS_CLIENT_READ_BUFFER).tls(settings));
        }
        server.add_service(proxy);
    }
    let certs = certs.map(|(certs, _)| certs);

    let follower = ChangeFollower::new(routes.clone(), certs, drain, changes);
    let follower_progress = FollowerProgress(follower.applied());
    server.add_service(background_service("store changes", follower));
    if let Some(redis) = redis_follower {
        server.add_service(background_service(
            "redis subscription",
            RedisSubscription(redis),
        ));
    }
    server.add_service(background_service(
        "health checks",
        HealthChecker::new(routes),
    ));
    server.add_service(background_service(
        "stop",
        AtShutdown {
            stopping,
            hyper_listener,
            store: embedded,
        },
    ));
    let mut admin_state = AdminState::new(store, config.admin_token.clone())
        .with_local_caches(Arc::new(follower_progress));
    if let Some(cache_redis) = cache_redis {
        admin_state = admin_state.with_shared_cache(Arc::new(CacheRedisPurge(cache_redis)));
    }
    if let Some(inspector) = inspector {
        admin_state = admin_state.with_waf(Arc::new(WafReload(inspector)));
    }
    server.add_service(background_service(
        "admin api",
        AdminService::new(admin_listener, admin_state),
    ));

    log::info!(
        "switchyard serving on {:?}: http on {}, https on {}, admin on {}, store {:?} in {}{}{}",
        config.engine,
        config.http,
        config
            .https
            .map_or_else(|| "off".to_string(), |a| a.to_string()),
        config.admin,
        config.store,
        config.data_dir.display(),
        config
            .http_hyper
            .map_or_else(String::new, |a| format!(", http on hyper on {a}")),
        config
            .https_hyper
            .map_or_else(String::new, |a| format!(", https on hyper on {a}"))
    );
    server.run(RunArgs::default());
    // Every request has finished: what the access log still holds is delivered or spooled.
    shutdown_log.finish(LOG_SHUTDOWN_GRACE);
    Ok(())
}

fn server_conf(config: &Config) -> ServerConf {
    let mut conf = ServerConf {
        threads: config.threads,
        grace_period_seconds: Some(config.shutdown_grace.as_secs()),
        graceful_shutdown_timeout_seconds: Some(1),
        // Idle backend connections kept warm, per thread (each thread is its own service
        // with its own pool), shared by all apps: 4,096 in all.
        upstream_keepalive_pool_size: (4096 / config.threads).max(1),
        // One single-threaded runtime per thread, like nginx's workers: measured ~9% more
        // requests/s than work stealing on 2 cores, with fewer cross-thread wake-ups.
        work_stealing: false,
        ..ServerConf::default()
    };
    // Pingora's pid and upgrade-socket files default to fixed /tmp paths shared by every
    // instance on the machine; keep them per data directory.
    let dir = config
        .data_dir
        .canonicalize()
        .unwrap_or_else(|_| PathBuf::from(&config.data_dir));
    conf.pid_file = dir.join("switchyard.pid").display().to_string();
    conf.upgrade_sock = dir.join("switchyard-upgrade.sock").display().to_string();
    conf
}

/// When this router stops accepting (SIGTERM, or SIGQUIT once the listeners are handed
/// over): answers stop offering keep-alive, and the embedded store is let go of so a router
/// taking over (`--upgrade`) can open it while this one finishes its requests.
struct AtShutdown {
    stopping: Arc<AtomicBool>,
    hyper_listener: Option<HyperListenerStop>,
    store: Option<EmbeddedStore>,
}

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for AtShutdown {
    async fn start(&self, mut shutdown: pingora::server::ShutdownWatch) {
        let _ = shutdown.changed().await;
        self.stopping.store(true, Ordering::Relaxed);
        if let Some(hyper_listener) = &self.hyper_listener {
            hyper_listener.stop();
        }
        if let Some(store) = self.store.clone() {
            // Closing writes redb's allocator state and syncs: not on the event loop.
            let _ = tokio::task::spawn_blocking(move || store.release()).await;
            log::info!("store released for the next router process");
        }
    }
}

/// Feeds the store's change events from Redis Pub/Sub.
struct RedisSubscription(RedisStore);

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for RedisSubscription {
    async fn start(&self, mut shutdown: pingora::server::ShutdownWatch) {
        self.0
            .follow_changes(async move {
                let _ = shutdown.changed().await;
            })
            .await;
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
    Ok(Some(cert))
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
        .target(env_logger::Target::Stderr)
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_gets_its_own_spelling_of_the_same_address() {
        for address in ["127.0.0.1:8080", "[::1]:443", "0.0.0.0:80"] {
            let address: SocketAddr = address.parse().expect("address");
            let keys: Vec<String> = (0..64).map(|t| thread_listen_key(address, t)).collect();
            assert_eq!(keys[0], address.to_string());
            for key in &keys {
                assert_eq!(key.parse::<SocketAddr>().expect(key), address);
            }
            let distinct: std::collections::HashSet<&String> = keys.iter().collect();
            assert_eq!(distinct.len(), keys.len());
        }
    }
}
