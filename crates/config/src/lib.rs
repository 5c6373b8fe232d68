//! `switchyard serve` settings from three sources: flags win over `SWITCHYARD_*`
//! environment variables (both handled by clap), which win over the TOML config file, which
//! wins over defaults. A config file with an unknown key or a bad value refuses to start,
//! naming the line.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use switchyard_acme::{AcmeSettings, ChallengeKind};
use switchyard_logs::ShipConfig;
use switchyard_model::{parse_cidr, ClientTimeouts, IpNet};
use switchyard_store::{RedisTarget, WriteAcks};

mod settings;

pub use settings::{reference as settings_reference, ServeArgs, SettingDoc};
use settings::{FileConfig, Setting, Settings};

/// How backends given by DNS name are resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsConfig {
    /// Shortest time an answer is kept.
    pub min_ttl: Duration,
    /// Longest time an answer is kept.
    pub max_ttl: Duration,
    /// Deadline of one query.
    pub timeout: Duration,
    /// Most names followed.
    pub max_names: usize,
    /// The resolver configuration file.
    pub resolv_conf: PathBuf,
    /// The hosts file.
    pub hosts_file: PathBuf,
    /// Nameservers instead of the resolver configuration's.
    pub servers: Vec<SocketAddr>,
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
        /// The replicas an app or certificate write waits for.
        acks: WriteAcks,
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
    /// The HTTP/3 listener's UDP address (needs the HTTPS listener's certificates).
    pub http3: Option<SocketAddr>,
    /// HTTP/3's 0-RTT taken, for safe methods only.
    pub http3_early_data: bool,
    /// Certificates and session tickets of the HTTPS listener.
    pub tls: TlsConfig,
    /// Admin API listener.
    pub admin: SocketAddr,
    /// The listener of /metrics and /healthz alone, without a token; `None`: off.
    pub metrics: Option<SocketAddr>,
    /// Embedded store, spools and the upgrade socket.
    pub data_dir: PathBuf,
    /// Where routes and certificates are kept.
    pub store: StoreChoice,
    /// Bearer token of the admin API (never empty).
    pub admin_token: Option<String>,
    /// Whether the dashboard may write (the API accepts writes from a browser).
    pub admin_ui_writes: bool,
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
    /// With `upgrade`: SIGQUIT to the router taken over from once its sockets are taken.
    pub quit_predecessor: bool,
    /// Most apps (and absent domains) kept in the route cache.
    pub route_cache_apps: usize,
    /// Most busy apps the traffic history keeps.
    pub history_max_apps: usize,
    /// Audit records the store keeps.
    pub audit_retention: usize,
    /// The admin API's TLS files, when it speaks HTTPS.
    pub admin_tls: Option<AdminTlsFiles>,
    /// Whose `X-Forwarded-For` limits believe.
    pub trusted_proxies: Vec<IpNet>,
    /// Most client records of per-client limits.
    pub limit_clients: usize,
    /// Between two syncs of fleet-wide app rates.
    pub limit_sync: Duration,
    /// How backends given by name are resolved.
    pub dns: DnsConfig,
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
    /// Most of one answer read ahead of its client; 0: read-ahead off.
    pub response_buffer_bytes: u64,
    /// Memory for answers read ahead, over all clients.
    pub response_buffer_memory_bytes: u64,
    /// Disk for answers read ahead, over all clients.
    pub response_spool_bytes: u64,
    /// How request bodies are read whole before they go on.
    pub request_buffering: RequestBufferingSettings,
    /// How apps' proxy-wasm filters run.
    pub filters: FilterSettings,
    /// Threads of the worker pool for CPU-bound stages.
    pub pool_threads: usize,
    /// Most tasks waiting for the pool.
    pub pool_queue: usize,
    /// Apps shown by name in the per-app cost series.
    pub usage_top_apps: usize,
    /// Whether requests' CPU is measured and charged to their apps.
    pub cpu_attribution: bool,
    /// Whether and how apps over their CPU share wait while an event loop is saturated.
    pub fair_share: FairShareSettings,
    /// How pool threads are scheduled.
    pub pool_sched: PoolSched,
    /// Certificates ordered by ACME, when a directory is set.
    pub acme: Option<AcmeSettings>,
}

/// Where access-log records go.
#[derive(Debug)]
pub enum AccessLogChoice {
    /// `stdout`, `off` or a file path.
    Local(String),
    /// Batched to log services.
    Ship(ShipConfig),
}

/// The admin API's certificate, key, and the CA its clients' certificates must chain to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminTlsFiles {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// PEM CA file for client certificates, when they are asked for.
    pub client_ca: Option<PathBuf>,
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
            None => Self::resolve_settings(
                Settings::merge(args, FileConfig::default()),
                &Source { file: None },
            ),
        }
    }

    /// As [`Config::resolve`], with the config file's text already read from `path` (which
    /// only names it in errors).
    pub fn resolve_with_file(args: ServeArgs, path: &Path, text: &str) -> anyhow::Result<Self> {
        let file: FileConfig = toml::from_str(text)
            .map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?;
        Self::resolve_settings(
            Settings::merge(args, file),
            &Source {
                file: Some((path, text)),
            },
        )
    }

    /// Every setting checked and made the type it is used as (the defaults are the list's),
    /// with the rules that span several settings.
    fn resolve_settings(settings: Settings, source: &Source<'_>) -> anyhow::Result<Self> {
        settings.check(source)?;
        let data_dir = settings.data_dir.resolved()?;
        let http = settings.http.address(source)?;
        let admin = settings.admin.address(source)?;
        let metrics = settings.metrics.address_or_off(source)?;
        let https = settings.https.address_or_off(source)?;
        let http3 = settings.http3.address_or_off(source)?;
        if http3.is_some() && https.is_none() {
            bail!("http3 needs the https listener (its certificates): https is off");
        }
        let tls = tls_config(
            (settings.default_cert, settings.default_key),
            settings
                .https_redirect_port
                .value
                .or(https.map(|a| a.port())),
            settings.cert_cache_size,
            settings.tls_ticket_rotation_s,
            settings.cert_expiry_scan_s,
        )?;
        let (replicas, wait) = (settings.store_ack_replicas, settings.store_ack_timeout_ms);
        let acks = write_acks(source, replicas, wait)?;
        let store = store_choice(source, settings.store, settings.redis_timeout_ms, acks)?;
        let admin_token = admin_token(settings.admin_token, admin)?;
        let admin_tls = admin_tls_files(
            source,
            settings.admin_tls_cert,
            settings.admin_tls_key,
            settings.admin_client_ca,
        )?;
        let cache_redis = cache_redis(
            source,
            &settings.cache_redis,
            settings.cache_redis_timeout_ms,
        )?;
        let trusted_proxies = trusted_proxies(source, &settings.trusted_proxies)?;
        let dns = dns_config(
            source,
            DnsSources {
                min_ttl_s: settings.dns_min_ttl_s,
                max_ttl_s: settings.dns_max_ttl_s,
                timeout_ms: settings.dns_timeout_ms,
                max_names: settings.dns_max_names,
                resolv_conf: settings.dns_resolv_conf,
                hosts_file: settings.dns_hosts_file,
                servers: settings.dns_servers,
            },
        )?;
        let acme = acme_settings(
            source,
            AcmeSources {
                directory: settings.acme_directory,
                email: settings.acme_email,
                eab_kid: settings.acme_eab_kid,
                eab_hmac: settings.acme_eab_hmac,
                ca_file: settings.acme_ca_file,
                check_interval_s: settings.acme_check_interval_s,
                orders_per_3h: settings.acme_orders_per_3h,
                challenge: settings.acme_challenge,
            },
            https.is_some(),
        )?;
        let access_log = access_log_choice(
            source,
            settings.access_log,
            settings.log_to,
            ShipSettings {
                batch_kb: settings.log_batch_kb,
                batch_delay_ms: settings.log_batch_delay_ms,
                buffer_mb: settings.log_buffer_mb,
                spool_dir: settings.log_spool_dir,
                spool_mb: settings.log_spool_mb,
            },
            &data_dir,
        )?;
        Ok(Self {
            http,
            https,
            http3,
            tls,
            admin,
            metrics,
            store,
            admin_token,
            http3_early_data: settings
                .http3_early_data
                .choice(source, &[("off", false), ("on", true)])?,
            admin_ui_writes: settings
                .admin_ui_writes
                .choice(source, &[("off", false), ("on", true)])?,
            access_log,
            threads: settings.threads.resolved()?,
            drain_grace: settings.drain_grace_s.seconds()?,
            shutdown_grace: settings.shutdown_grace_s.seconds()?,
            client_timeouts: ClientTimeouts {
                header: settings.client_header_timeout_s.seconds()?,
                idle: settings.client_idle_timeout_s.seconds()?,
                body: settings.client_body_timeout_s.seconds()?,
                send: settings.client_send_timeout_s.seconds()?,
            },
            upgrade: settings.upgrade,
            quit_predecessor: settings.quit_predecessor,
            route_cache_apps: settings.route_cache_apps.resolved()?,
            history_max_apps: settings.history_max_apps.resolved()?,
            audit_retention: settings.audit_retention.resolved()?,
            admin_tls,
            trusted_proxies,
            limit_sync: settings.limit_sync_ms.millis()?,
            dns,
            limit_clients: settings.limit_clients.resolved()?,
            cache_memory_bytes: settings.cache_memory_mb.mebibytes()?,
            cache_redis,
            waf: settings.waf.on_off(source)?,
            waf_rules: settings.waf_rules.value,
            waf_spool_bytes: settings.waf_spool_mb.mebibytes()?,
            response_buffer_bytes: settings.response_buffer_mb.mebibytes()?,
            response_buffer_memory_bytes: settings.response_buffer_memory_mb.mebibytes()?,
            response_spool_bytes: settings.response_spool_mb.mebibytes()?,
            request_buffering: RequestBufferingSettings {
                per_request_bytes: settings.request_buffer_kb.resolved()?.saturating_mul(1024),
                memory_bytes: settings.request_buffer_memory_mb.mebibytes()?,
                spool_bytes: settings.request_spool_mb.mebibytes()?,
                min_rate: settings.request_body_min_rate.resolved()?,
                grace: settings.request_body_grace_s.seconds()?,
                deadline: settings.request_body_deadline_s.seconds()?,
            },
            filters: FilterSettings::of(
                settings.filter_deadline_ms,
                settings.filter_memory_mb,
                settings.filter_instances,
                &data_dir,
            )?,
            pool_threads: settings.pool_threads.resolved()?,
            pool_queue: settings.pool_queue.resolved()?,
            usage_top_apps: settings.usage_top_apps.resolved()?,
            cpu_attribution: settings.cpu_attribution.on_off(source)?,
            fair_share: FairShareSettings {
                on: settings.fair_share.on_off(source)?,
                lag: settings.fair_share_lag_ms.millis()?,
                queue: settings.fair_share_queue_ms.millis()?,
            },
            pool_sched: settings.pool_sched.choice(
                source,
                &[("idle", PoolSched::Idle), ("nice", PoolSched::Nice)],
            )?,
            acme,
            data_dir,
        })
    }
}

/// The HTTPS listener's certificates and keys: a default certificate (its key given with
/// it), where plain HTTP is redirected, and the certificate cache's timers.
fn tls_config(
    (cert, key): (Setting<PathBuf>, Setting<PathBuf>),
    redirect_port: Option<u16>,
    cert_cache_size: Setting<usize>,
    ticket_rotation_s: Setting<u64>,
    expiry_scan_s: Setting<u64>,
) -> anyhow::Result<TlsConfig> {
    Ok(TlsConfig {
        default_cert: match (cert.value, key.value) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => bail!("default_cert and default_key must be given together"),
        },
        redirect_port,
        cert_cache_size: cert_cache_size.resolved()?,
        ticket_rotation: ticket_rotation_s.seconds()?,
        expiry_scan: expiry_scan_s.seconds()?,
    })
}

/// The route store: embedded, or a Redis (or Sentinel-watched Redis) URL, its password
/// from the environment.
/// `--store-ack-replicas` and its timeout.
/// The bootstrap admin token (the setting, else the systemd credential), required when the
/// admin API listens beyond loopback.
fn admin_token(setting: Setting<String>, admin: SocketAddr) -> anyhow::Result<Option<String>> {
    let token = match setting.value.filter(|t| !t.is_empty()) {
        Some(token) => Some(token),
        None => credential("admin_token")?,
    };
    if token.is_none() && !admin.ip().is_loopback() {
        bail!(
            "the admin API on {admin} would be reachable from other hosts without a token; \
             set --admin-token (or SWITCHYARD_ADMIN_TOKEN) or bind it to 127.0.0.1"
        );
    }
    Ok(token)
}

/// The admin API's TLS files: certificate and key together, a client CA only with them.
fn admin_tls_files(
    source: &Source<'_>,
    cert: Setting<PathBuf>,
    key: Setting<PathBuf>,
    client_ca: Setting<PathBuf>,
) -> anyhow::Result<Option<AdminTlsFiles>> {
    let client_ca_at = client_ca.at(source);
    match (cert.value, key.value, client_ca.value) {
        (Some(cert), Some(key), client_ca) => Ok(Some(AdminTlsFiles {
            cert,
            key,
            client_ca,
        })),
        (None, None, None) => Ok(None),
        (None, None, Some(_)) => bail!(
            "{client_ca_at}: client certificates need the admin API over TLS (admin_tls_cert \
             and admin_tls_key)"
        ),
        _ => bail!("admin_tls_cert and admin_tls_key must be given together"),
    }
}

fn write_acks(
    source: &Source<'_>,
    replicas: Setting<String>,
    timeout_ms: Setting<u64>,
) -> anyhow::Result<WriteAcks> {
    let at = replicas.at(source);
    let replicas = match replicas.resolved()?.as_str() {
        "auto" => None,
        count => Some(count.parse::<u32>().map_err(|_| {
            anyhow::anyhow!("{at}: '{count}' is neither `auto` nor a number of replicas")
        })?),
    };
    Ok(WriteAcks {
        replicas,
        timeout: timeout_ms.millis()?,
    })
}

fn store_choice(
    source: &Source<'_>,
    store: Setting<String>,
    redis_timeout_ms: Setting<u64>,
    acks: WriteAcks,
) -> anyhow::Result<StoreChoice> {
    let at = store.at(source);
    let redis_timeout = redis_timeout_ms.millis()?;
    Ok(match store.resolved()?.as_str() {
        "embedded" => StoreChoice::Embedded,
        url if url.starts_with("redis") => {
            if let Err(reason) = RedisTarget::parse(url) {
                bail!("{at}: {reason}");
            }
            StoreChoice::Redis {
                url: with_password(url, redis_password()?),
                timeout: redis_timeout,
                acks,
            }
        }
        other => bail!(
            "{at}: '{other}' is not a store; use `embedded`, `redis://HOST:PORT/DB` or \
             `redis+sentinel://HOST:PORT[,HOST:PORT…]/MASTER_NAME/DB`"
        ),
    })
}

/// The DNS settings as given.
struct DnsSources {
    min_ttl_s: Setting<u64>,
    max_ttl_s: Setting<u64>,
    timeout_ms: Setting<u64>,
    max_names: Setting<usize>,
    resolv_conf: Setting<PathBuf>,
    hosts_file: Setting<PathBuf>,
    servers: Setting<String>,
}

fn dns_config(source: &Source<'_>, given: DnsSources) -> anyhow::Result<DnsConfig> {
    let min_ttl = given.min_ttl_s.seconds()?;
    let max_ttl_at = given.max_ttl_s.at(source);
    let max_ttl = given.max_ttl_s.seconds()?;
    if max_ttl < min_ttl {
        bail!(
            "{max_ttl_at}: must be at least dns_min_ttl_s ({}s)",
            min_ttl.as_secs()
        );
    }
    let servers_at = given.servers.at(source);
    let servers = given
        .servers
        .value
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<SocketAddr>().map_err(|_| {
                anyhow::anyhow!(
                    "{servers_at}: '{s}' is not an ip:port address (e.g. 127.0.0.1:8600)"
                )
            })
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(DnsConfig {
        min_ttl,
        max_ttl,
        timeout: given.timeout_ms.millis()?,
        max_names: given.max_names.resolved()?,
        resolv_conf: given.resolv_conf.resolved()?,
        hosts_file: given.hosts_file.resolved()?,
        servers,
    })
}

/// How worker-pool threads share the CPU with the event loops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolSched {
    /// SCHED_IDLE, and while light requests are under way workers give way to threads
    /// waiting for a CPU.
    Idle,
    /// nice 10.
    Nice,
}

/// The ACME settings as given.
struct AcmeSources {
    directory: Setting<String>,
    email: Setting<String>,
    eab_kid: Setting<String>,
    eab_hmac: Setting<String>,
    ca_file: Setting<PathBuf>,
    check_interval_s: Setting<u64>,
    orders_per_3h: Setting<usize>,
    challenge: Setting<String>,
}

/// ACME is on when a directory is given; the other settings are refused without one, so
/// that a typo in the directory's name does not silently leave certificates unordered.
fn acme_settings(
    source: &Source<'_>,
    given: AcmeSources,
    https_listener: bool,
) -> anyhow::Result<Option<AcmeSettings>> {
    let Some(directory) = given.directory.value.clone() else {
        for (set, at) in [
            (given.email.value.is_some(), given.email.at(source)),
            (given.challenge.value.is_some(), given.challenge.at(source)),
            (given.eab_kid.value.is_some(), given.eab_kid.at(source)),
            (given.eab_hmac.value.is_some(), given.eab_hmac.at(source)),
            (given.ca_file.value.is_some(), given.ca_file.at(source)),
        ] {
            if set {
                bail!("{at}: needs acme_directory");
            }
        }
        return Ok(None);
    };
    if !directory.starts_with("https://") || directory.parse::<http::Uri>().is_err() {
        bail!(
            "{}: must be the https:// URL of an ACME directory",
            given.directory.at(source)
        );
    }
    let eab = match (given.eab_kid.value.clone(), given.eab_hmac.value.as_deref()) {
        (None, None) => None,
        (Some(kid), Some(hmac)) => Some((
            kid,
            base64url(hmac)
                .with_context(|| format!("{}: not base64url", given.eab_hmac.at(source)))?,
        )),
        (Some(_), None) => bail!("{}: needs acme_eab_hmac too", given.eab_kid.at(source)),
        (None, Some(_)) => bail!("{}: needs acme_eab_kid too", given.eab_hmac.at(source)),
    };
    if let Some(path) = &given.ca_file.value {
        if let Err(e) = std::fs::metadata(path) {
            bail!(
                "{}: cannot read {}: {e}",
                given.ca_file.at(source),
                path.display()
            );
        }
    }
    let challenge_at = given.challenge.at(source);
    let challenge = given.challenge.choice(
        source,
        &[
            ("http-01", ChallengeKind::Http01),
            ("tls-alpn-01", ChallengeKind::TlsAlpn01),
        ],
    )?;
    if challenge == ChallengeKind::TlsAlpn01 && !https_listener {
        bail!("{challenge_at}: tls-alpn-01 is answered on the HTTPS listener, which is off");
    }
    Ok(Some(AcmeSettings {
        directory,
        challenge,
        email: given.email.value.filter(|e| !e.is_empty()),
        eab,
        ca_file: given.ca_file.value,
        check_interval: given.check_interval_s.seconds()?,
        orders_per_3h: given.orders_per_3h.resolved()?,
    }))
}

/// Decodes base64url (padded or not), as CAs give EAB keys.
fn base64url(text: &str) -> anyhow::Result<Vec<u8>> {
    let mut standard: String = text
        .trim()
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    while !standard.len().is_multiple_of(4) {
        standard.push('=');
    }
    Ok(openssl::base64::decode_block(&standard)?)
}

/// The settings of shipping access logs to log services.
struct ShipSettings {
    batch_kb: Setting<usize>,
    batch_delay_ms: Setting<u64>,
    buffer_mb: Setting<usize>,
    spool_dir: Setting<PathBuf>,
    spool_mb: Setting<u64>,
}

/// A local access log, or shipping to log services: one or the other, so that where lines
/// end up is never ambiguous.
fn access_log_choice(
    source: &Source<'_>,
    local: Setting<String>,
    log_to: Setting<Vec<String>>,
    ship: ShipSettings,
    data_dir: &Path,
) -> anyhow::Result<AccessLogChoice> {
    let services = match log_to.value.as_deref() {
        Some(services) if !services.is_empty() => services.to_vec(),
        _ => return Ok(AccessLogChoice::Local(local.resolved()?)),
    };
    if local.value.is_some() {
        bail!(
            "{}: access logs go either to log services or to access_log; remove one",
            log_to.at(source)
        );
    }
    for service in &services {
        let port = service.rsplit_once(':').map(|(_, p)| p.parse::<u16>());
        if !matches!(port, Some(Ok(p)) if p > 0) {
            bail!("{}: '{service}' is not HOST:PORT", log_to.at(source));
        }
    }
    let batch_kb = ship.batch_kb.resolved()?;
    Ok(AccessLogChoice::Ship(ShipConfig {
        services,
        batch_bytes: batch_kb * 1024,
        batch_delay: ship.batch_delay_ms.millis()?,
        buffer_bytes: ship.buffer_mb.resolved()?.saturating_mul(1 << 20),
        spool_dir: ship
            .spool_dir
            .value
            .unwrap_or_else(|| data_dir.join("log-spool")),
        spool_bytes: ship.spool_mb.mebibytes()?,
    }))
}

/// Puts `password` (from the environment) into a Redis URL that has none, so it need not
/// appear in a config file or a process listing.
/// The Redis password from `SWITCHYARD_REDIS_PASSWORD`, or else the `redis_password`
/// credential.
fn redis_password() -> anyhow::Result<Option<String>> {
    match std::env::var("SWITCHYARD_REDIS_PASSWORD") {
        Ok(password) if !password.is_empty() => Ok(Some(password)),
        _ => credential("redis_password"),
    }
}

/// The secret `name` systemd hands the service (`LoadCredential=name:FILE`), from the
/// directory it names in `CREDENTIALS_DIRECTORY`, readable by the service alone; `None`
/// without one. A trailing line break is not part of it.
fn credential(name: &str) -> anyhow::Result<Option<String>> {
    let Some(directory) = std::env::var_os("CREDENTIALS_DIRECTORY") else {
        return Ok(None);
    };
    let path = std::path::Path::new(&directory).join(name);
    match std::fs::read_to_string(&path) {
        Ok(secret) => {
            let secret = secret.trim_end_matches(['\n', '\r']);
            if secret.is_empty() {
                bail!("the credential {} is empty", path.display());
            }
            Ok(Some(secret.to_string()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => bail!("cannot read the credential {}: {e}", path.display()),
    }
}

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

#[cfg(test)]
mod tests {
    use clap::Args;

    use super::*;

    #[test]
    fn the_reference_types_every_setting_as_an_operator_reads_it() {
        for setting in settings_reference() {
            let shown = setting.operator_type();
            assert!(
                !["text", "String", "u64", "usize", "PathBuf"].contains(&shown),
                "{} is typed `{shown}` in the reference: name what it holds (settings.rs, \
                 text_type) or give its key the suffix of its unit",
                setting.key
            );
        }
    }

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
    fn the_deploy_kits_example_settings_are_valid() {
        let example = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/systemd/switchyard.toml"
        ))
        .expect("deploy/systemd/switchyard.toml");
        let config = with_file(&example).expect("the example resolves");
        assert_eq!(config.http.to_string(), "0.0.0.0:80");
        assert_eq!(
            config.http3.map(|a| a.to_string()).as_deref(),
            Some("0.0.0.0:443")
        );
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
    fn help_shows_each_default_from_the_list_that_applies_it() {
        let mut command = ServeArgs::augment_args(clap::Command::new("serve"));
        let help = command.render_long_help().to_string();
        let line_of = |flag: &str| {
            let at = help
                .find(flag)
                .unwrap_or_else(|| panic!("{flag} in --help"));
            help[at..].split("[env:").next().unwrap_or("").to_string()
        };
        assert!(
            line_of("--drain-grace-s").contains("[default: 30]"),
            "{help}"
        );
        assert!(line_of("--store").contains("[default: embedded]"), "{help}");
        assert!(
            line_of("--dns-hosts-file").contains("[default: /etc/hosts]"),
            "{help}"
        );
        // A setting without a default says so in its doc, and shows none.
        assert!(!line_of("--admin-token").contains("[default:"), "{help}");
        let config = Config::resolve(ServeArgs::default()).expect("defaults are valid");
        assert_eq!(config.drain_grace, Duration::from_secs(30));
        assert_eq!(config.dns.hosts_file, PathBuf::from("/etc/hosts"));
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
        let err = with_file("\npool_sched = \"pinned\"\n").expect_err("a benchmark's only");
        assert!(err.to_string().contains("line 2: pool_sched"), "{err}");
        // The list's check, whether or not the logs are shipped.
        let err = with_file("\n\nlog_batch_kb = 65\n").expect_err("past a frame");
        assert!(err.to_string().contains("line 3: log_batch_kb"), "{err}");
        assert!(err.to_string().contains("at most 64"), "{err}");
        let err = with_file("waf_spool_mb = 0\n").expect_err("no spool");
        assert!(err.to_string().contains("line 1: waf_spool_mb"), "{err}");
        let err = with_file("\n\nclient_send_timeout_s = 0\n").expect_err("no send deadline");
        assert!(
            err.to_string().contains("line 3: client_send_timeout_s"),
            "{err}"
        );
        // Every setting is checked alike now: a zero drain grace was taken silently.
        let err = with_file("\ndrain_grace_s = 0\n").expect_err("no drain grace");
        assert!(err.to_string().contains("line 2: drain_grace_s"), "{err}");
        let err = with_file("waf = \"maybe\"\n").expect_err("unknown waf mode");
        assert!(err.to_string().contains("line 1: waf"), "{err}");
        assert!(err.to_string().contains("`on`, `off`"), "{err}");
        let config = with_file("shutdown_grace_s = 0\n").expect("stopping at once is allowed");
        assert_eq!(config.shutdown_grace, Duration::ZERO);
        let config = with_file("pool_queue = 8\nwaf_spool_mb = 2\n").expect("valid");
        assert_eq!(config.pool_queue, 8);
        assert_eq!(config.waf_spool_bytes, 2 << 20);
    }

    #[test]
    fn http3_is_off_unless_given_and_needs_the_https_listener() {
        assert!(with_file("").expect("valid").http3.is_none());
        let config = with_file("http3 = \"127.0.0.1:9443\"\n").expect("valid");
        assert_eq!(config.http3.map(|a| a.port()), Some(9443));
        let refused = with_file("https = \"off\"\nhttp3 = \"127.0.0.1:9443\"\n")
            .expect_err("no certificates without https");
        assert!(refused.to_string().contains("http3"), "{refused}");
        let refused = with_file("http3 = \"nowhere\"\n").expect_err("not an address");
        assert!(refused.to_string().contains("line 1"), "{refused}");
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
    fn sentinel_urls_are_taken_and_a_malformed_one_is_refused_with_its_line() {
        let config = with_file(
            "store = \"redis+sentinel://:secret@127.0.0.1:26379,127.0.0.1:26380/main/0\"\n",
        )
        .expect("valid");
        let shown = format!("{:?}", config.store);
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("26380/main/0"), "{shown}");
        let err = with_file("\nstore = \"redis+sentinel://127.0.0.1:26379\"\n")
            .expect_err("no primary name");
        assert!(err.to_string().contains("line 2"), "{err}");
        assert!(err.to_string().contains("primary's name"), "{err}");
        let err =
            with_file("cache_redis = \"redis+sentinel://h:1/m/x\"\n").expect_err("bad database");
        assert!(err.to_string().contains("line 1"), "{err}");
        assert!(err.to_string().contains("not a database"), "{err}");
    }

    #[test]
    fn dns_settings_are_checked_with_their_line() {
        let config = with_file("dns_servers = \"127.0.0.1:8600, 10.0.0.2:53\"\n").expect("valid");
        assert_eq!(config.dns.servers.len(), 2);
        assert_eq!(config.dns.min_ttl, Duration::from_secs(1));
        let err = with_file("dns_min_ttl_s = 30\ndns_max_ttl_s = 10\n").expect_err("max < min");
        assert!(err.to_string().contains("line 2: dns_max_ttl_s"), "{err}");
        let err = with_file("\ndns_servers = \"consul:8600\"\n").expect_err("not ip:port");
        assert!(err.to_string().contains("line 2: dns_servers"), "{err}");
    }

    #[test]
    fn a_public_admin_address_needs_a_token() {
        let err = with_file("admin = \"0.0.0.0:8081\"\n").expect_err("no token");
        assert!(err.to_string().contains("token"), "{err}");
        assert!(with_file("admin = \"0.0.0.0:8081\"\nadmin_token = \"s3cret\"\n").is_ok());
    }

    #[test]
    fn acme_settings_are_refused_with_their_line() {
        let cases = [
            ("acme_email = \"ops@example.com\"\n", "line 1: acme_email: needs acme_directory"),
            ("acme_directory = \"http://ca.test/dir\"\n", "line 1: acme_directory"),
            (
                "acme_directory = \"https://ca.test/dir\"\nacme_eab_kid = \"kid\"\n",
                "line 2: acme_eab_kid: needs acme_eab_hmac too",
            ),
            (
                "acme_directory = \"https://ca.test/dir\"\nacme_eab_kid = \"k\"\nacme_eab_hmac = \"%%\"\n",
                "line 3: acme_eab_hmac: not base64url",
            ),
            (
                "acme_directory = \"https://ca.test/dir\"\nacme_ca_file = \"/nonexistent/ca.pem\"\n",
                "line 2: acme_ca_file: cannot read",
            ),
            (
                "acme_directory = \"https://ca.test/dir\"\nacme_challenge = \"dns-01\"\n",
                "line 2: acme_challenge: 'dns-01' is not one of `http-01`, `tls-alpn-01`",
            ),
            (
                "https = \"off\"\nacme_directory = \"https://ca.test/dir\"\nacme_challenge = \"tls-alpn-01\"\n",
                "line 3: acme_challenge: tls-alpn-01 is answered on the HTTPS listener, which is off",
            ),
            ("acme_challenge = \"tls-alpn-01\"\n", "line 1: acme_challenge: needs acme_directory"),
        ];
        for (file, expected) in cases {
            let err = with_file(file).expect_err(file);
            assert!(format!("{err:#}").contains(expected), "{file}: {err:#}");
        }
    }

    #[test]
    fn acme_is_on_with_a_directory_and_decodes_the_eab_key() {
        let config = with_file(
            "acme_directory = \"https://ca.test/dir\"\nacme_eab_kid = \"kid-1\"\nacme_eab_hmac = \"aGVsbG8_-w\"\n",
        )
        .expect("valid");
        let acme = config.acme.expect("acme on");
        assert_eq!(acme.directory, "https://ca.test/dir");
        assert_eq!(
            acme.eab,
            Some(("kid-1".to_string(), b"hello?\xfb".to_vec()))
        );
        assert_eq!(acme.check_interval, Duration::from_secs(3600));
        assert_eq!(acme.challenge, ChallengeKind::Http01);
        assert!(with_file("").expect("defaults").acme.is_none());
    }
}

/// How apps' proxy-wasm filters run, unless an app's filter sets its own.
#[derive(Debug, Clone)]
pub struct FilterSettings {
    /// CPU time one callback may use.
    pub deadline: Duration,
    /// Memory one instance may grow to.
    pub memory_bytes: u64,
    /// Instances of one app's filter per event-loop thread.
    pub instances_per_thread: usize,
    /// Where compiled modules are kept (by hash) across restarts.
    pub cache_dir: PathBuf,
}

/// Request bodies read whole before they go on (`--request-buffer-*`, `--request-body-*`).
#[derive(Debug, Clone, Copy)]
pub struct RequestBufferingSettings {
    /// Bytes of one body kept in memory; a larger one is spooled.
    pub per_request_bytes: u64,
    /// Memory all bodies being read may hold.
    pub memory_bytes: u64,
    /// Disk all bodies being read may hold.
    pub spool_bytes: u64,
    /// The pace an upload must keep after its grace, in bytes a second (0: none).
    pub min_rate: u64,
    /// How long before an upload's pace counts.
    pub grace: Duration,
    /// How long a whole body may take.
    pub deadline: Duration,
}

/// The fair share of the event loops' CPU among apps (`--fair-share*`).
#[derive(Debug, Clone, Copy)]
pub struct FairShareSettings {
    /// Whether it runs.
    pub on: bool,
    /// An event loop is saturated past this lag.
    pub lag: Duration,
    /// How long a request over its app's share may wait.
    pub queue: Duration,
}

impl FilterSettings {
    fn of(
        deadline_ms: settings::Setting<u64>,
        memory_mb: settings::Setting<u64>,
        instances: settings::Setting<usize>,
        data_dir: &std::path::Path,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            deadline: deadline_ms.millis()?,
            memory_bytes: memory_mb.mebibytes()?,
            instances_per_thread: instances.resolved()?,
            cache_dir: data_dir.join("filter-cache"),
        })
    }
}

/// The networks whose `X-Forwarded-For` is believed, from a comma-separated list.
fn trusted_proxies(
    source: &Source<'_>,
    list: &settings::Setting<String>,
) -> anyhow::Result<Vec<IpNet>> {
    match list.value.as_deref() {
        None => Ok(Vec::new()),
        Some(given) => given
            .split(',')
            .map(str::trim)
            .filter(|cidr| !cidr.is_empty())
            .map(parse_cidr)
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow::anyhow!("{}: {e}", list.at(source))),
    }
}

/// The response cache's Redis URL (checked) and per-call deadline, when one is set.
fn cache_redis(
    source: &Source<'_>,
    url: &settings::Setting<String>,
    timeout_ms: settings::Setting<u64>,
) -> anyhow::Result<Option<(String, Duration)>> {
    let timeout = timeout_ms.millis()?;
    match url.value.as_deref() {
        Some(given) => {
            if let Err(reason) = RedisTarget::parse(given) {
                bail!("{}: {reason}", url.at(source));
            }
            Ok(Some((given.to_string(), timeout)))
        }
        None => Ok(None),
    }
}
