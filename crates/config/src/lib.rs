//! `switchyard serve` settings from three sources: flags win over `SWITCHYARD_*`
//! environment variables (both handled by clap), which win over the TOML config file, which
//! wins over defaults. A config file with an unknown key or a bad value refuses to start,
//! naming the line.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use serde::Deserialize;
use switchyard_logs::ShipConfig;
use switchyard_model::{ClientTimeouts, DEFAULT_CLIENT_TIMEOUT_S};
use toml::Spanned;

/// Flags of `switchyard serve`. Each may also be set as `SWITCHYARD_<FLAG>` or in the file.
#[derive(Args, Debug, Default)]
pub struct ServeArgs {
    /// TOML config file.
    #[arg(long, env = "SWITCHYARD_CONFIG")]
    config: Option<PathBuf>,
    /// Plain HTTP listener address.
    #[arg(long, env = "SWITCHYARD_HTTP")]
    http: Option<String>,
    /// HTTPS listener address, or `off`.
    #[arg(long, env = "SWITCHYARD_HTTPS")]
    https: Option<String>,
    /// PEM certificate chain served to TLS clients whose server name has no certificate.
    #[arg(long, env = "SWITCHYARD_DEFAULT_CERT")]
    default_cert: Option<PathBuf>,
    /// PEM private key of `--default-cert`.
    #[arg(long, env = "SWITCHYARD_DEFAULT_KEY")]
    default_key: Option<PathBuf>,
    /// Port put in HTTP→HTTPS redirects (default: the HTTPS listener's port).
    #[arg(long, env = "SWITCHYARD_HTTPS_REDIRECT_PORT")]
    https_redirect_port: Option<u16>,
    /// Most parsed certificates kept in memory.
    #[arg(long, env = "SWITCHYARD_CERT_CACHE_SIZE")]
    cert_cache_size: Option<usize>,
    /// Seconds between rotations of the TLS session-ticket key (two keys are kept).
    #[arg(long, env = "SWITCHYARD_TLS_TICKET_ROTATION_S")]
    tls_ticket_rotation_s: Option<u64>,
    /// Seconds between scans counting certificates that expire soon.
    #[arg(long, env = "SWITCHYARD_CERT_EXPIRY_SCAN_S")]
    cert_expiry_scan_s: Option<u64>,
    /// Admin API address.
    #[arg(long, env = "SWITCHYARD_ADMIN")]
    admin: Option<String>,
    /// Directory of the embedded store.
    #[arg(long, env = "SWITCHYARD_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// `embedded`, or `redis://HOST:PORT/DB` for a fleet.
    #[arg(long, env = "SWITCHYARD_STORE")]
    store: Option<String>,
    /// Bearer token required by every admin call but /healthz.
    #[arg(long, env = "SWITCHYARD_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Access log: `stdout`, `off`, or a file path.
    #[arg(long, env = "SWITCHYARD_ACCESS_LOG")]
    access_log: Option<String>,
    /// Worker threads for the proxy (default: number of cores).
    #[arg(long, env = "SWITCHYARD_THREADS")]
    threads: Option<usize>,
    /// Seconds the connections of a deleted app, or of a domain moved to another app, go on
    /// before they are closed (a backend removed from an app keeps its connections).
    #[arg(long, env = "SWITCHYARD_DRAIN_GRACE_S")]
    drain_grace_s: Option<u64>,
    /// Seconds in-flight requests get to finish after SIGTERM.
    #[arg(long, env = "SWITCHYARD_SHUTDOWN_GRACE_S")]
    shutdown_grace_s: Option<u64>,
    /// Seconds a client has to send a whole request head (HTTP/1.1) before its connection is
    /// closed.
    #[arg(long, env = "SWITCHYARD_CLIENT_HEADER_TIMEOUT_S")]
    client_header_timeout_s: Option<u64>,
    /// Seconds an HTTP/1.1 client connection may stay idle between requests before it is closed.
    #[arg(long, env = "SWITCHYARD_CLIENT_IDLE_TIMEOUT_S")]
    client_idle_timeout_s: Option<u64>,
    /// Seconds the router waits for each piece of an HTTP/1.1 request body before it closes
    /// the connection (408). Not applied to WebSockets.
    #[arg(long, env = "SWITCHYARD_CLIENT_BODY_TIMEOUT_S")]
    client_body_timeout_s: Option<u64>,
    /// Seconds a client may take to accept each piece (at most 64 KiB) of a response before the
    /// router closes the connection.
    #[arg(long, env = "SWITCHYARD_CLIENT_SEND_TIMEOUT_S")]
    client_send_timeout_s: Option<u64>,
    /// Take over the listening sockets of the router running with the same data directory
    /// (send it SIGQUIT once this one is started); it drains and exits.
    #[arg(long)]
    upgrade: bool,
    /// Most apps kept in the in-process route cache.
    #[arg(long, env = "SWITCHYARD_ROUTE_CACHE_APPS")]
    route_cache_apps: Option<usize>,
    /// Memory for cached responses over all apps, in MiB (each app's `cache.max_bytes` is
    /// reserved from it).
    #[arg(long, env = "SWITCHYARD_CACHE_MEMORY_MB")]
    cache_memory_mb: Option<u64>,
    /// Redis of the response cache (redis://HOST:PORT/DB): apps with a Redis cache store.
    /// Keep it apart from the route store: a cache Redis evicts (allkeys-lru).
    #[arg(long, env = "SWITCHYARD_CACHE_REDIS")]
    cache_redis: Option<String>,
    /// Deadline of one cache Redis lookup, in milliseconds; slower is a miss.
    #[arg(long, env = "SWITCHYARD_CACHE_REDIS_TIMEOUT_MS")]
    cache_redis_timeout_ms: Option<u64>,
    /// Deadline of one Redis call (and of connecting), in milliseconds.
    #[arg(long, env = "SWITCHYARD_REDIS_TIMEOUT_MS")]
    redis_timeout_ms: Option<u64>,
    /// `on` (default): load the OWASP Core Rule Set for apps with a `waf` option, refusing to
    /// start if it cannot load; `off`: run without it (those apps follow `on_overload`).
    #[arg(long, env = "SWITCHYARD_WAF")]
    waf: Option<String>,
    /// The platform's own ModSecurity rules and CRS exclusions, included after the CRS
    /// (reloaded with `POST /v1/waf/reload`).
    #[arg(long, env = "SWITCHYARD_WAF_RULES")]
    waf_rules: Option<String>,
    /// Most disk, in MiB, that request bodies waiting for the WAF may use at once (in
    /// DATA_DIR/waf-spool); past it a body follows its app's `on_overload`.
    #[arg(long, env = "SWITCHYARD_WAF_SPOOL_MB")]
    waf_spool_mb: Option<u64>,
    /// Threads for CPU-bound stages such as the WAF (default: number of cores).
    #[arg(long, env = "SWITCHYARD_POOL_THREADS")]
    pool_threads: Option<usize>,
    /// Most tasks waiting for those threads; more are refused at once.
    #[arg(long, env = "SWITCHYARD_POOL_QUEUE")]
    pool_queue: Option<usize>,
    /// `threads` (default), or `inline`: CPU-heavy stages run on the event loop that took
    /// the request. Only for measuring what the pool saves (bench/bench_waf.py,
    /// bench/bench_images.py); never for serving.
    #[arg(long, env = "SWITCHYARD_POOL_MODE")]
    pool_mode: Option<String>,
    /// Ship access logs to this log service (`switchyard logd`), HOST:PORT; repeat for
    /// fallbacks, tried in order. Replaces the local access log.
    #[arg(long = "log-to", env = "SWITCHYARD_LOG_TO", value_delimiter = ',')]
    log_to: Vec<String>,
    /// Largest access-log batch in KiB (at most 64).
    #[arg(long, env = "SWITCHYARD_LOG_BATCH_KB")]
    log_batch_kb: Option<usize>,
    /// Longest a record waits for its batch to fill, in milliseconds.
    #[arg(long, env = "SWITCHYARD_LOG_BATCH_DELAY_MS")]
    log_batch_delay_ms: Option<u64>,
    /// Memory for batches waiting for the log service, in MiB; past it they spool to disk.
    #[arg(long, env = "SWITCHYARD_LOG_BUFFER_MB")]
    log_buffer_mb: Option<usize>,
    /// Directory of the on-disk spool (default: DATA_DIR/log-spool).
    #[arg(long, env = "SWITCHYARD_LOG_SPOOL_DIR")]
    log_spool_dir: Option<PathBuf>,
    /// Most disk the spool may use, in MiB; past it records are dropped and counted.
    #[arg(long, env = "SWITCHYARD_LOG_SPOOL_MB")]
    log_spool_mb: Option<u64>,
}

/// The same settings as read from the TOML file; spans locate bad values.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    http: Option<Spanned<String>>,
    https: Option<Spanned<String>>,
    default_cert: Option<PathBuf>,
    default_key: Option<PathBuf>,
    https_redirect_port: Option<u16>,
    cert_cache_size: Option<Spanned<usize>>,
    tls_ticket_rotation_s: Option<Spanned<u64>>,
    cert_expiry_scan_s: Option<Spanned<u64>>,
    admin: Option<Spanned<String>>,
    data_dir: Option<PathBuf>,
    store: Option<Spanned<String>>,
    admin_token: Option<String>,
    access_log: Option<String>,
    threads: Option<Spanned<usize>>,
    drain_grace_s: Option<u64>,
    shutdown_grace_s: Option<u64>,
    client_header_timeout_s: Option<Spanned<u64>>,
    client_idle_timeout_s: Option<Spanned<u64>>,
    client_body_timeout_s: Option<Spanned<u64>>,
    client_send_timeout_s: Option<Spanned<u64>>,
    route_cache_apps: Option<Spanned<usize>>,
    cache_memory_mb: Option<Spanned<u64>>,
    cache_redis: Option<Spanned<String>>,
    cache_redis_timeout_ms: Option<Spanned<u64>>,
    redis_timeout_ms: Option<Spanned<u64>>,
    waf: Option<Spanned<String>>,
    waf_rules: Option<String>,
    waf_spool_mb: Option<Spanned<u64>>,
    pool_threads: Option<Spanned<usize>>,
    pool_queue: Option<Spanned<usize>>,
    pool_mode: Option<Spanned<String>>,
    log_to: Option<Spanned<Vec<String>>>,
    log_batch_kb: Option<Spanned<usize>>,
    log_batch_delay_ms: Option<Spanned<u64>>,
    log_buffer_mb: Option<Spanned<usize>>,
    log_spool_dir: Option<PathBuf>,
    log_spool_mb: Option<Spanned<u64>>,
}

/// Which store holds the routes.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreChoice {
    /// The redb file in the data directory.
    Embedded,
    /// A Redis shared by a fleet of routers.
    Redis {
        /// Connection URL, password included when one was given.
        url: String,
        /// Per-call deadline.
        timeout: Duration,
    },
}

impl std::fmt::Debug for StoreChoice {
    // Never print a password into logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Embedded => f.write_str("embedded"),
            Self::Redis { url, .. } => match url.split_once('@') {
                Some((scheme_and_auth, rest)) => {
                    let scheme = scheme_and_auth.split("://").next().unwrap_or("redis");
                    write!(f, "{scheme}://***@{rest}")
                }
                None => f.write_str(url),
            },
        }
    }
}

/// Resolved, validated settings.
#[derive(Debug)]
pub struct Config {
    /// Plain HTTP listener.
    pub http: SocketAddr,
    /// HTTPS listener, unless switched off.
    pub https: Option<SocketAddr>,
    /// Certificates and session tickets of the HTTPS listener.
    pub tls: TlsConfig,
    /// Admin API listener.
    pub admin: SocketAddr,
    /// Embedded store, spools and the upgrade socket.
    pub data_dir: PathBuf,
    /// Where routes and certificates are kept.
    pub store: StoreChoice,
    /// Bearer token of the admin API (never empty).
    pub admin_token: Option<String>,
    /// Where access-log records go.
    pub access_log: AccessLogChoice,
    /// Event-loop threads of the proxy.
    pub threads: usize,
    /// How long the connections of a deleted app or a moved domain go on before they are
    /// closed.
    pub drain_grace: Duration,
    /// How long in-flight requests get after SIGTERM.
    pub shutdown_grace: Duration,
    /// Deadlines for clients: sending a head, idling between requests, sending a body, taking
    /// an answer.
    pub client_timeouts: ClientTimeouts,
    /// Started to replace a running router (listener hand-off).
    pub upgrade: bool,
    /// Most apps (and absent domains) kept in the route cache.
    pub route_cache_apps: usize,
    /// Memory for cached responses over all apps.
    pub cache_memory_bytes: u64,
    /// The response cache's Redis URL and per-call deadline.
    pub cache_redis: Option<(String, Duration)>,
    /// Whether the Core Rule Set is loaded.
    pub waf: bool,
    /// Extra rules file included after the CRS.
    pub waf_rules: Option<String>,
    /// Disk for request bodies waiting for the WAF.
    pub waf_spool_bytes: u64,
    /// Threads of the worker pool for CPU-bound stages.
    pub pool_threads: usize,
    /// Most tasks waiting for the pool.
    pub pool_queue: usize,
    /// Heavy stages run on the event loop instead of the pool (benchmarks only).
    pub pool_inline: bool,
}

/// Where access-log records go.
#[derive(Debug)]
pub enum AccessLogChoice {
    /// `stdout`, `off` or a file path.
    Local(String),
    /// Batched to log services.
    Ship(ShipConfig),
}

/// Settings of the HTTPS listener.
#[derive(Debug)]
pub struct TlsConfig {
    /// PEM files of the certificate for names without their own.
    pub default_cert: Option<(PathBuf, PathBuf)>,
    /// Port put in HTTP→HTTPS redirects.
    pub redirect_port: Option<u16>,
    /// Most parsed certificates kept in memory.
    pub cert_cache_size: usize,
    /// Interval between session-ticket key rotations.
    pub ticket_rotation: Duration,
    /// Interval between scans for certificates about to expire.
    pub expiry_scan: Duration,
}

/// Where a value came from, for error messages.
struct Source<'a> {
    file: Option<(&'a Path, &'a str)>,
}

impl Source<'_> {
    fn at(&self, span: Option<std::ops::Range<usize>>, key: &str) -> String {
        match (self.file, span) {
            (Some((path, text)), Some(span)) => {
                let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
                format!("{} line {line}: {key}", path.display())
            }
            _ => format!("--{}", key.replace('_', "-")),
        }
    }
}

impl Config {
    /// Merges flags, environment and file, and validates the result.
    pub fn resolve(args: ServeArgs) -> anyhow::Result<Self> {
        match args.config.clone() {
            Some(path) => {
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read config file {}", path.display()))?;
                Self::resolve_with_file(args, &path, &text)
            }
            None => Self::resolve_sources(args, FileConfig::default(), Source { file: None }),
        }
    }

    /// As [`Config::resolve`], with the config file's text already read from `path` (which
    /// only names it in errors).
    pub fn resolve_with_file(args: ServeArgs, path: &Path, text: &str) -> anyhow::Result<Self> {
        let file: FileConfig = toml::from_str(text)
            .map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?;
        Self::resolve_sources(
            args,
            file,
            Source {
                file: Some((path, text)),
            },
        )
    }

    fn resolve_sources(
        args: ServeArgs,
        file: FileConfig,
        source: Source<'_>,
    ) -> anyhow::Result<Self> {
        // Read before the fields below are taken out of `args` and `file`.
        let data_dir = args
            .data_dir
            .clone()
            .or(file.data_dir.clone())
            .unwrap_or_else(|| PathBuf::from("./switchyard-data"));
        let access_log = access_log_choice(&source, &args, &file, &data_dir)?;

        let http = address(&source, "http", args.http, file.http, "0.0.0.0:8080")?;
        let admin = address(&source, "admin", args.admin, file.admin, "127.0.0.1:8081")?;
        let https = match pick(args.https, file.https) {
            Some((value, _)) if value == "off" => None,
            given => Some(parse_address(&source, "https", given, "0.0.0.0:8443")?),
        };
        let tls = TlsConfig {
            default_cert: match (
                args.default_cert.or(file.default_cert),
                args.default_key.or(file.default_key),
            ) {
                (Some(cert), Some(key)) => Some((cert, key)),
                (None, None) => None,
                _ => bail!("default_cert and default_key must be given together"),
            },
            redirect_port: args
                .https_redirect_port
                .or(file.https_redirect_port)
                .or(https.map(|a| a.port())),
            cert_cache_size: at_least_one(
                &source,
                "cert_cache_size",
                args.cert_cache_size,
                file.cert_cache_size,
                10_000,
            )?,
            ticket_rotation: Duration::from_secs(at_least_one(
                &source,
                "tls_ticket_rotation_s",
                args.tls_ticket_rotation_s,
                file.tls_ticket_rotation_s,
                3600,
            )?),
            expiry_scan: Duration::from_secs(at_least_one(
                &source,
                "cert_expiry_scan_s",
                args.cert_expiry_scan_s,
                file.cert_expiry_scan_s,
                300,
            )?),
        };
        let store = match pick(args.store, file.store) {
            None => StoreChoice::Embedded,
            Some((value, _)) if value == "embedded" => StoreChoice::Embedded,
            Some((value, _)) if value.starts_with("redis://") || value.starts_with("rediss://") => {
                let timeout = Duration::from_millis(at_least_one(
                    &source,
                    "redis_timeout_ms",
                    args.redis_timeout_ms,
                    file.redis_timeout_ms,
                    500,
                )?);
                StoreChoice::Redis {
                    url: with_password(&value, std::env::var("SWITCHYARD_REDIS_PASSWORD").ok()),
                    timeout,
                }
            }
            Some((value, span)) => bail!(
                "{}: '{value}' is not a store; use `embedded` or `redis://HOST:PORT/DB`",
                source.at(span, "store")
            ),
        };
        let admin_token = args
            .admin_token
            .or(file.admin_token)
            .filter(|t| !t.is_empty());
        if admin_token.is_none() && !admin.ip().is_loopback() {
            bail!(
                "the admin API on {admin} would be reachable from other hosts without a token; \
                 set --admin-token (or SWITCHYARD_ADMIN_TOKEN) or bind it to 127.0.0.1"
            );
        }
        let threads = match pick(args.threads, file.threads) {
            Some((0, span)) => bail!("{}: must be at least 1", source.at(span, "threads")),
            Some((n, _)) => n,
            None => std::thread::available_parallelism().map_or(2, usize::from),
        };
        let route_cache_apps = at_least_one(
            &source,
            "route_cache_apps",
            args.route_cache_apps,
            file.route_cache_apps,
            100_000,
        )?;
        let cache_memory_bytes = mebibytes(
            &source,
            "cache_memory_mb",
            args.cache_memory_mb,
            file.cache_memory_mb,
            256,
        )?;
        let cache_redis_timeout = Duration::from_millis(at_least_one(
            &source,
            "cache_redis_timeout_ms",
            args.cache_redis_timeout_ms,
            file.cache_redis_timeout_ms,
            50,
        )?);
        let cache_redis = match pick(args.cache_redis, file.cache_redis) {
            Some((url, span)) => {
                if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
                    bail!(
                        "{}: must be a redis:// or rediss:// URL",
                        source.at(span, "cache_redis")
                    );
                }
                Some((url, cache_redis_timeout))
            }
            None => None,
        };
        let waf = match pick(args.waf, file.waf) {
            None => true,
            Some((value, _)) if value == "on" => true,
            Some((value, _)) if value == "off" => false,
            Some((value, span)) => {
                bail!("{}: '{value}' is not `on` or `off`", source.at(span, "waf"))
            }
        };
        let pool_threads = at_least_one(
            &source,
            "pool_threads",
            args.pool_threads,
            file.pool_threads,
            std::thread::available_parallelism().map_or(2, usize::from),
        )?;
        let pool_queue = at_least_one(
            &source,
            "pool_queue",
            args.pool_queue,
            file.pool_queue,
            1024,
        )?;
        let pool_inline = match pick(args.pool_mode, file.pool_mode) {
            None => false,
            Some((value, _)) if value == "threads" => false,
            Some((value, _)) if value == "inline" => true,
            Some((value, span)) => {
                bail!(
                    "{}: '{value}' is not `threads` or `inline`",
                    source.at(span, "pool_mode")
                )
            }
        };
        Ok(Self {
            http,
            https,
            tls,
            admin,
            data_dir,
            store,
            admin_token,
            access_log,
            threads,
            drain_grace: Duration::from_secs(
                args.drain_grace_s.or(file.drain_grace_s).unwrap_or(30),
            ),
            shutdown_grace: Duration::from_secs(
                args.shutdown_grace_s
                    .or(file.shutdown_grace_s)
                    .unwrap_or(10),
            ),
            client_timeouts: ClientTimeouts {
                header: client_deadline(
                    &source,
                    "client_header_timeout_s",
                    args.client_header_timeout_s,
                    file.client_header_timeout_s,
                )?,
                idle: client_deadline(
                    &source,
                    "client_idle_timeout_s",
                    args.client_idle_timeout_s,
                    file.client_idle_timeout_s,
                )?,
                body: client_deadline(
                    &source,
                    "client_body_timeout_s",
                    args.client_body_timeout_s,
                    file.client_body_timeout_s,
                )?,
                send: client_deadline(
                    &source,
                    "client_send_timeout_s",
                    args.client_send_timeout_s,
                    file.client_send_timeout_s,
                )?,
            },
            upgrade: args.upgrade,
            route_cache_apps,
            cache_memory_bytes,
            cache_redis,
            waf,
            waf_rules: args.waf_rules.or(file.waf_rules),
            waf_spool_bytes: mebibytes(
                &source,
                "waf_spool_mb",
                args.waf_spool_mb,
                file.waf_spool_mb,
                1024,
            )?,
            pool_threads,
            pool_queue,
            pool_inline,
        })
    }
}

/// A local access log, or shipping to log services: one or the other, so that where lines
/// end up is never ambiguous.
fn access_log_choice(
    source: &Source<'_>,
    args: &ServeArgs,
    file: &FileConfig,
    data_dir: &Path,
) -> anyhow::Result<AccessLogChoice> {
    let local = args.access_log.clone().or(file.access_log.clone());
    let services = if args.log_to.is_empty() {
        pick(None, file.log_to.clone())
    } else {
        Some((args.log_to.clone(), None))
    };
    let Some((services, span)) = services.filter(|(s, _)| !s.is_empty()) else {
        return Ok(AccessLogChoice::Local(
            local.unwrap_or_else(|| "stdout".into()),
        ));
    };
    if local.is_some() {
        bail!(
            "{}: access logs go either to log services or to access_log; remove one",
            source.at(span, "log_to")
        );
    }
    for service in &services {
        let port = service.rsplit_once(':').map(|(_, p)| p.parse::<u16>());
        if !matches!(port, Some(Ok(p)) if p > 0) {
            bail!(
                "{}: '{service}' is not HOST:PORT",
                source.at(span.clone(), "log_to")
            );
        }
    }
    let batch_kb = at_least_one(
        source,
        "log_batch_kb",
        args.log_batch_kb,
        file.log_batch_kb.clone(),
        64,
    )?;
    if batch_kb > 64 {
        let span = file.log_batch_kb.as_ref().map(Spanned::span);
        bail!(
            "{}: at most 64 (KiB per batch)",
            source.at(span.filter(|_| args.log_batch_kb.is_none()), "log_batch_kb")
        );
    }
    Ok(AccessLogChoice::Ship(ShipConfig {
        services,
        batch_bytes: batch_kb * 1024,
        batch_delay: Duration::from_millis(at_least_one(
            source,
            "log_batch_delay_ms",
            args.log_batch_delay_ms,
            file.log_batch_delay_ms.clone(),
            200,
        )?),
        buffer_bytes: at_least_one(
            source,
            "log_buffer_mb",
            args.log_buffer_mb,
            file.log_buffer_mb.clone(),
            16,
        )?
        .saturating_mul(1 << 20),
        spool_dir: args
            .log_spool_dir
            .clone()
            .or(file.log_spool_dir.clone())
            .unwrap_or_else(|| data_dir.join("log-spool")),
        spool_bytes: mebibytes(
            source,
            "log_spool_mb",
            args.log_spool_mb,
            file.log_spool_mb.clone(),
            1024,
        )?,
    }))
}

/// Puts `password` (from the environment) into a Redis URL that has none, so it need not
/// appear in a config file or a process listing.
fn with_password(url: &str, password: Option<String>) -> String {
    let Some(password) = password.filter(|p| !p.is_empty()) else {
        return url.to_string();
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    if rest
        .split('/')
        .next()
        .is_some_and(|authority| authority.contains('@'))
    {
        return url.to_string();
    }
    let encoded: String = password
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    format!("{scheme}://:{encoded}@{rest}")
}

/// The flag/env value if given, else the file's value with its span.
fn pick<T>(
    flag: Option<T>,
    file: Option<Spanned<T>>,
) -> Option<(T, Option<std::ops::Range<usize>>)> {
    match (flag, file) {
        (Some(value), _) => Some((value, None)),
        (None, Some(spanned)) => {
            let span = spanned.span();
            Some((spanned.into_inner(), Some(span)))
        }
        (None, None) => None,
    }
}

fn at_least_one<T: PartialEq + From<u8>>(
    source: &Source<'_>,
    key: &str,
    flag: Option<T>,
    file: Option<Spanned<T>>,
    default: T,
) -> anyhow::Result<T> {
    match pick(flag, file) {
        Some((n, span)) if n == T::from(0) => {
            bail!("{}: must be at least 1", source.at(span, key))
        }
        Some((n, _)) => Ok(n),
        None => Ok(default),
    }
}

/// A size given in MiB (at least one), in bytes.
fn mebibytes(
    source: &Source<'_>,
    key: &str,
    flag: Option<u64>,
    file: Option<Spanned<u64>>,
    default_mib: u64,
) -> anyhow::Result<u64> {
    Ok(at_least_one(source, key, flag, file, default_mib)?.saturating_mul(1 << 20))
}

/// One of the client deadlines, in whole seconds: at least one, 60 unless given.
fn client_deadline(
    source: &Source<'_>,
    key: &str,
    flag: Option<u64>,
    file: Option<Spanned<u64>>,
) -> anyhow::Result<Duration> {
    let seconds = at_least_one(source, key, flag, file, DEFAULT_CLIENT_TIMEOUT_S)?;
    Ok(Duration::from_secs(seconds))
}

fn address(
    source: &Source<'_>,
    key: &str,
    flag: Option<String>,
    file: Option<Spanned<String>>,
    default: &str,
) -> anyhow::Result<SocketAddr> {
    parse_address(source, key, pick(flag, file), default)
}

fn parse_address(
    source: &Source<'_>,
    key: &str,
    given: Option<(String, Option<std::ops::Range<usize>>)>,
    default: &str,
) -> anyhow::Result<SocketAddr> {
    let (text, span) = given.unwrap_or_else(|| (default.to_string(), None));
    text.parse().map_err(|_| {
        anyhow::anyhow!(
            "{}: '{text}' is not an ip:port address (e.g. 0.0.0.0:8080)",
            source.at(span, key)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_file(contents: &str) -> anyhow::Result<Config> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("switchyard.toml");
        std::fs::write(&path, contents)?;
        Config::resolve(ServeArgs {
            config: Some(path),
            ..ServeArgs::default()
        })
    }

    #[test]
    fn defaults_match_the_contract() {
        let config = Config::resolve(ServeArgs::default()).expect("defaults are valid");
        assert_eq!(config.http.to_string(), "0.0.0.0:8080");
        assert_eq!(config.admin.to_string(), "127.0.0.1:8081");
        assert_eq!(
            config.https.map(|a| a.to_string()).as_deref(),
            Some("0.0.0.0:8443")
        );
        assert_eq!(config.data_dir, PathBuf::from("./switchyard-data"));
        assert_eq!(config.store, StoreChoice::Embedded);
        assert_eq!(config.client_timeouts, ClientTimeouts::default());
    }

    #[test]
    fn flags_win_over_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "http = \"127.0.0.1:1000\"\nadmin = \"127.0.0.1:1001\"\n",
        )
        .expect("write");
        let config = Config::resolve(ServeArgs {
            config: Some(path),
            http: Some("127.0.0.1:2000".into()),
            ..ServeArgs::default()
        })
        .expect("valid");
        assert_eq!(config.http.port(), 2000);
        assert_eq!(config.admin.port(), 1001);
    }

    #[test]
    fn bad_config_names_the_line() {
        let err =
            with_file("http = \"127.0.0.1:1000\"\nadmin = \"nowhere\"\n").expect_err("bad address");
        assert!(err.to_string().contains("line 2: admin"), "{err}");
        let err = with_file("http = \"127.0.0.1:1000\"\n\nlisten = 1\n").expect_err("unknown key");
        assert!(err.to_string().contains("line 3"), "{err}");
        assert!(err.to_string().contains("unknown field"), "{err}");
        let err = with_file("threads = 0\n").expect_err("zero threads");
        assert!(err.to_string().contains("line 1: threads"), "{err}");
        let err = with_file("\npool_mode = \"inlined\"\n").expect_err("unknown pool mode");
        assert!(err.to_string().contains("line 2: pool_mode"), "{err}");
        let err = with_file("waf_spool_mb = 0\n").expect_err("no spool");
        assert!(err.to_string().contains("line 1: waf_spool_mb"), "{err}");
        let err = with_file("\n\nclient_send_timeout_s = 0\n").expect_err("no send deadline");
        assert!(
            err.to_string().contains("line 3: client_send_timeout_s"),
            "{err}"
        );
        let config = with_file("pool_mode = \"inline\"\nwaf_spool_mb = 2\n").expect("valid");
        assert!(config.pool_inline);
        assert_eq!(config.waf_spool_bytes, 2 << 20);
    }

    #[test]
    fn https_can_be_switched_off_and_redirects_follow_its_port() {
        let config = with_file("https = \"off\"\n").expect("valid");
        assert!(config.https.is_none());
        assert_eq!(config.tls.redirect_port, None);
        let config = with_file("https = \"127.0.0.1:9443\"\n").expect("valid");
        assert_eq!(config.tls.redirect_port, Some(9443));
        let err = with_file("default_cert = \"/x.pem\"\n").expect_err("key missing");
        assert!(err.to_string().contains("default_key"), "{err}");
        let err = with_file("\ncert_cache_size = 0\n").expect_err("zero cache");
        assert!(err.to_string().contains("line 2: cert_cache_size"), "{err}");
    }

    #[test]
    fn an_engine_setting_is_refused_naming_its_line() {
        // `engine`, `http_hyper` and `https_hyper` chose between Pingora and hyper while
        // both engines existed; a file that still sets one is told so, not silently obeyed.
        let err = with_file("\nengine = \"pingora\"\n").expect_err("no engine setting");
        assert!(err.to_string().contains("engine"), "{err}");
        assert!(err.to_string().contains("line 2"), "{err}");
    }

    #[test]
    fn redis_urls_take_the_password_from_the_environment_and_never_print_it() {
        assert_eq!(
            with_password("redis://10.0.0.1:6379/2", Some("p@ss w".into())),
            "redis://:p%40ss%20w@10.0.0.1:6379/2"
        );
        assert_eq!(
            with_password("redis://:given@h:1/0", Some("env".into())),
            "redis://:given@h:1/0"
        );
        let config = with_file("store = \"redis://:secret@127.0.0.1:6379/0\"\n").expect("valid");
        let shown = format!("{:?}", config.store);
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("127.0.0.1:6379/0"), "{shown}");
    }

    #[test]
    fn a_public_admin_address_needs_a_token() {
        let err = with_file("admin = \"0.0.0.0:8081\"\n").expect_err("no token");
        assert!(err.to_string().contains("token"), "{err}");
        assert!(with_file("admin = \"0.0.0.0:8081\"\nadmin_token = \"s3cret\"\n").is_ok());
    }
}
