//! The settings of `switchyard serve`, each declared once: its doc, flag, file key, type,
//! environment variable, default and check (the `settings!` list). From it come the command
//! line, the file format, and each value merged (flag or environment over file over
//! default) and checked, with the flag or the file's line to name in an error; `lib.rs`
//! turns the values into the `Config` the binary uses.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use serde::Deserialize;
use switchyard_model::{DEFAULT_CLIENT_TIMEOUT_S, DEFAULT_LIMIT_CLIENTS};
use toml::Spanned;

use crate::Source;

/// Declares every setting once: its doc (the `--help` text, to which its default is added),
/// name (the flag `--name`, the file key `name`), type, environment variable and default.
/// From the one list come the command line ([`ServeArgs`], with `--config`, `--log-to` and
/// `--upgrade`, which are not ordinary values), the file format (`FileConfig`: the same
/// keys, each with its place in the file), and `Settings`: each value merged once — flag or
/// environment over file — and carrying its key, place and default, so an error names the
/// flag or the file's line. An entry's `check` (a [`Check`]) refuses a bad value before
/// anything is resolved; the conversions (`Setting::seconds`, …) need no second default.
macro_rules! settings {
    ($( $(#[doc = $doc:literal])* $(#[arg($($arg:tt)*)])? $name:ident: $kind:ty = $env:literal $(, default $default:expr)? $(, check $check:path)?; )*) => {
        /// Flags of `switchyard serve`. Each may also be set as `SWITCHYARD_<FLAG>` or in the
        /// file.
        #[derive(Args, Debug, Default)]
        pub struct ServeArgs {
            /// TOML config file.
            #[arg(long, env = "SWITCHYARD_CONFIG")]
            pub(crate) config: Option<PathBuf>,
            $(
                #[arg(
                    long,
                    env = $env,
                    help = help_text(
                        concat!($($doc),*),
                        None $(.or(Some(Shown::shown(&IntoDefault::<$kind>::into_default($default)))))?,
                    )
                    $(, $($arg)*)?
                )]
                pub(crate) $name: Option<$kind>,
            )*
            /// Ship access logs to this log service (`switchyard logd`), HOST:PORT; repeat
            /// for fallbacks, tried in order. Replaces the local access log.
            #[arg(long = "log-to", env = "SWITCHYARD_LOG_TO", value_delimiter = ',')]
            pub(crate) log_to: Vec<String>,
            /// Take over the listening sockets of the router running with the same data
            /// directory (send it SIGQUIT once this one has logged that it took them over);
            /// it finishes its requests and exits.
            #[arg(long)]
            pub(crate) upgrade: bool,
            /// With `--upgrade`: send the router taken over from SIGQUIT as soon as its
            /// sockets are taken, instead of waiting for the operator to (systemd's
            /// `ExecReload`, deploy/systemd/switchyard.service).
            #[arg(long, requires = "upgrade")]
            pub(crate) quit_predecessor: bool,
        }

        /// The settings as read from the TOML file; spans locate bad values.
        #[derive(Deserialize, Default)]
        #[serde(deny_unknown_fields)]
        pub(crate) struct FileConfig {
            log_to: Option<Spanned<Vec<String>>>,
            $( $name: Option<Spanned<$kind>>, )*
        }

        /// Every setting as the reference shows it (`switchyard reference`), in the order
        /// declared, those that are not ordinary values first (their words are their
        /// flags' own, from `ServeArgs`).
        pub fn reference() -> Vec<SettingDoc> {
            let serve = <ServeArgs as Args>::augment_args(clap::Command::new("serve"));
            let mut settings: Vec<SettingDoc> = [
                ("config", "path", false),
                ("log_to", "list of HOST:PORT", true),
                ("upgrade", "flag", false),
                ("quit_predecessor", "flag", false),
            ]
            .into_iter()
            .map(|(key, kind, in_file)| SettingDoc::of_flag(&serve, key, kind, in_file))
            .collect();
            $(
                settings.push(SettingDoc::new(
                    stringify!($name),
                    $env.to_string(),
                    stringify!($kind),
                    true,
                    None $(.or(Some(reference_default(
                        stringify!($default),
                        Shown::shown(&IntoDefault::<$kind>::into_default($default)),
                    ))))?,
                    concat!($($doc),*),
                ));
            )*
            settings
        }

        /// Every setting, merged from the flags, the environment and the file.
        pub(crate) struct Settings {
            pub(crate) upgrade: bool,
            pub(crate) quit_predecessor: bool,
            pub(crate) log_to: Setting<Vec<String>>,
            $( pub(crate) $name: Setting<$kind>, )*
        }

        impl Settings {
            pub(crate) fn merge(args: ServeArgs, file: FileConfig) -> Self {
                // An empty `--log-to` list is no flag at all: the file's may stand.
                let log_to = (!args.log_to.is_empty()).then_some(args.log_to);
                Self {
                    upgrade: args.upgrade,
                    quit_predecessor: args.quit_predecessor,
                    log_to: Setting::merge("log_to", log_to, file.log_to, None, None),
                    $( $name: Setting::merge(
                        stringify!($name),
                        args.$name,
                        file.$name,
                        None $(.or(Some(IntoDefault::<$kind>::into_default($default))))?,
                        None $(.or(Some($check as Check<$kind>)))?,
                    ), )*
                }
            }

            /// Every value (given, or the default) through its entry's check; the error
            /// names the flag or the file's line.
            pub(crate) fn check(&self, source: &Source<'_>) -> anyhow::Result<()> {
                $( self.$name.check(source)?; )*
                Ok(())
            }
        }
    };
}

settings! {
    /// Plain HTTP listener address.
    http: String = "SWITCHYARD_HTTP", default "0.0.0.0:8080";
    /// HTTPS listener address, or `off`.
    https: String = "SWITCHYARD_HTTPS", default "0.0.0.0:8443";
    /// HTTP/3 (QUIC) listener's UDP address, or `off`: the HTTPS listener's certificates,
    /// advertised to its clients by `Alt-Svc`.
    http3: String = "SWITCHYARD_HTTP3", default "off";
    /// HTTP/3's 0-RTT: `off`, or `on` to take requests a returning client sends before its
    /// handshake ends. Early data can be replayed by an attacker: only GET, HEAD and OPTIONS
    /// are taken early, reaching the app with `Early-Data: 1` (RFC 8470); any other method
    /// is answered 425 Too Early, and the client sends it again after the handshake.
    http3_early_data: String = "SWITCHYARD_HTTP3_EARLY_DATA", default "off";
    /// PEM certificate chain served to TLS clients whose server name has no certificate.
    default_cert: PathBuf = "SWITCHYARD_DEFAULT_CERT";
    /// PEM private key of `--default-cert`.
    default_key: PathBuf = "SWITCHYARD_DEFAULT_KEY";
    /// Port put in HTTP→HTTPS redirects (default: the HTTPS listener's port).
    https_redirect_port: u16 = "SWITCHYARD_HTTPS_REDIRECT_PORT";
    /// Most parsed certificates kept in memory.
    cert_cache_size: usize = "SWITCHYARD_CERT_CACHE_SIZE", default 10_000, check at_least_one;
    /// Seconds between rotations of the TLS session-ticket key (two keys are kept).
    tls_ticket_rotation_s: u64 = "SWITCHYARD_TLS_TICKET_ROTATION_S", default 3600, check at_least_one;
    /// Seconds between scans counting certificates that expire soon.
    cert_expiry_scan_s: u64 = "SWITCHYARD_CERT_EXPIRY_SCAN_S", default 300, check at_least_one;
    /// Admin API address.
    admin: String = "SWITCHYARD_ADMIN", default "127.0.0.1:8081";
    /// Address of a listener that serves /metrics and /healthz without a token and nothing
    /// else (for Prometheus on another machine: the admin token can change every app), or
    /// `off`.
    metrics: String = "SWITCHYARD_METRICS", default "off";
    /// Directory of the embedded store.
    data_dir: PathBuf = "SWITCHYARD_DATA_DIR", default "./switchyard-data";
    /// `embedded`, or for a fleet `redis://HOST:PORT/DB` or
    /// `redis+sentinel://HOST:PORT[,HOST:PORT…]/MASTER_NAME/DB` (the primary the Sentinels name).
    store: String = "SWITCHYARD_STORE", default "embedded";
    /// Bearer token required by every admin call but /healthz.
    #[arg(hide_env_values = true)]
    admin_token: String = "SWITCHYARD_ADMIN_TOKEN";
    /// PEM certificate chain of the admin API: with `admin_tls_key`, the admin API speaks
    /// HTTPS only (for an admin API reached over the network).
    admin_tls_cert: PathBuf = "SWITCHYARD_ADMIN_TLS_CERT";
    /// PEM private key of `admin_tls_cert`.
    admin_tls_key: PathBuf = "SWITCHYARD_ADMIN_TLS_KEY";
    /// PEM file of the CA(s) admin clients' certificates must chain to: a client without
    /// one is refused in the handshake (needs `admin_tls_cert`). The token is still asked.
    admin_client_ca: PathBuf = "SWITCHYARD_ADMIN_CLIENT_CA";
    /// Audit records the store keeps (every write through the admin API is one); the oldest
    /// go first.
    audit_retention: usize = "SWITCHYARD_AUDIT_RETENTION", default 100_000, check at_least_one;
    /// `off`: the dashboard at /ui/ is read-only, and the admin API refuses writes
    /// made by a browser (calls carrying `Origin`); `on`: the dashboard may edit apps and
    /// purge caches with the token.
    admin_ui_writes: String = "SWITCHYARD_ADMIN_UI_WRITES", default "off";
    /// Access log: `stdout`, `off`, or a file path.
    access_log: String = "SWITCHYARD_ACCESS_LOG", default "stdout";
    /// Worker threads for the proxy (the number of cores).
    threads: usize = "SWITCHYARD_THREADS", default cores(), check at_least_one;
    /// Seconds the connections of a deleted app, or of a domain moved to another app, go on
    /// before they are closed (a backend removed from an app keeps its connections).
    drain_grace_s: u64 = "SWITCHYARD_DRAIN_GRACE_S", default 30, check at_least_one;
    // No check: zero is allowed, a router asked to stop at once (a benchmark's).
    /// Seconds in-flight requests get to finish after SIGTERM.
    shutdown_grace_s: u64 = "SWITCHYARD_SHUTDOWN_GRACE_S", default 10;
    /// Seconds a client has to send a whole request head (HTTP/1.1) before its connection is
    /// closed.
    client_header_timeout_s: u64 = "SWITCHYARD_CLIENT_HEADER_TIMEOUT_S", default DEFAULT_CLIENT_TIMEOUT_S, check at_least_one;
    /// Seconds an HTTP/1.1 client connection may stay idle between requests before it is closed.
    client_idle_timeout_s: u64 = "SWITCHYARD_CLIENT_IDLE_TIMEOUT_S", default DEFAULT_CLIENT_TIMEOUT_S, check at_least_one;
    /// Seconds the router waits for each piece of an HTTP/1.1 request body before it closes
    /// the connection (408). Not applied to WebSockets.
    client_body_timeout_s: u64 = "SWITCHYARD_CLIENT_BODY_TIMEOUT_S", default DEFAULT_CLIENT_TIMEOUT_S, check at_least_one;
    /// Seconds a client may take to accept each piece (at most 64 KiB) of a response before the
    /// router closes the connection.
    client_send_timeout_s: u64 = "SWITCHYARD_CLIENT_SEND_TIMEOUT_S", default DEFAULT_CLIENT_TIMEOUT_S, check at_least_one;
    /// Most apps kept in the in-process route cache.
    route_cache_apps: usize = "SWITCHYARD_ROUTE_CACHE_APPS", default 100_000, check at_least_one;
    /// Most busy apps whose last 15 minutes of traffic are kept for `switchyard top` and
    /// `GET /v1/stats/apps` (about 1.2 KB each).
    history_max_apps: usize = "SWITCHYARD_HISTORY_MAX_APPS", default 10_000, check at_least_one;
    /// Proxies in front of the router whose `X-Forwarded-For` is believed for apps' limits
    /// and IP rules: CIDRs separated by commas (none: the peer is the client).
    trusted_proxies: String = "SWITCHYARD_TRUSTED_PROXIES";
    /// Most client records kept for per-client limits, all apps together (about 70 bytes
    /// each); past it the least used are forgotten.
    limit_clients: usize = "SWITCHYARD_LIMIT_CLIENTS", default DEFAULT_LIMIT_CLIENTS, check at_least_one;
    /// Milliseconds between two syncs of fleet-wide app rates with the Redis store: the
    /// fleet may admit up to (routers − 1) × (rate × 2 × this + burst) more than
    /// the rate.
    limit_sync_ms: u64 = "SWITCHYARD_LIMIT_SYNC_MS", default 100, check at_least_one;
    /// Backends given by DNS name are resolved again no sooner than this after an answer,
    /// whatever its TTL.
    dns_min_ttl_s: u64 = "SWITCHYARD_DNS_MIN_TTL_S", default 1, check at_least_one;
    /// ... and no later than this; a failing name is retried from the minimum,
    /// doubling up to this.
    dns_max_ttl_s: u64 = "SWITCHYARD_DNS_MAX_TTL_S", default 60, check at_least_one;
    /// Deadline of one DNS query, in milliseconds.
    dns_timeout_ms: u64 = "SWITCHYARD_DNS_TIMEOUT_MS", default 2000, check at_least_one;
    /// Most backend names followed.
    dns_max_names: usize = "SWITCHYARD_DNS_MAX_NAMES", default 10_000, check at_least_one;
    /// Resolver configuration: nameservers, search domains.
    dns_resolv_conf: PathBuf = "SWITCHYARD_DNS_RESOLV_CONF", default "/etc/resolv.conf";
    /// Static names, read again when the file changes.
    dns_hosts_file: PathBuf = "SWITCHYARD_DNS_HOSTS_FILE", default "/etc/hosts";
    /// Nameservers to ask instead of resolv.conf's, IP:PORT separated by commas (e.g.
    /// Consul's DNS, 127.0.0.1:8600).
    dns_servers: String = "SWITCHYARD_DNS_SERVERS";
    /// Memory for cached responses over all apps, in MiB (each app's `cache.max_bytes` is
    /// reserved from it).
    cache_memory_mb: u64 = "SWITCHYARD_CACHE_MEMORY_MB", default 256, check at_least_one;
    /// Redis of the response cache (redis://HOST:PORT/DB or redis+sentinel://…): apps with a
    /// Redis cache store.
    /// Keep it apart from the route store: a cache Redis evicts (allkeys-lru).
    cache_redis: String = "SWITCHYARD_CACHE_REDIS";
    /// Deadline of one cache Redis lookup, in milliseconds; slower is a miss.
    cache_redis_timeout_ms: u64 = "SWITCHYARD_CACHE_REDIS_TIMEOUT_MS", default 50, check at_least_one;
    /// Deadline of one Redis call (and of connecting), in milliseconds.
    redis_timeout_ms: u64 = "SWITCHYARD_REDIS_TIMEOUT_MS", default 500, check at_least_one;
    /// With a Redis store, how many replicas must hold an app or certificate write before it
    /// is answered (Redis `WAIT`): `auto` (1 when the primary has a replica, 0 when it has
    /// none) or a number. Fewer within `--store-ack-timeout-ms`: 503, the write on the
    /// primary but not yet safe from a failover.
    store_ack_replicas: String = "SWITCHYARD_STORE_ACK_REPLICAS", default "auto";
    /// How long a write waits for its replicas, in milliseconds.
    store_ack_timeout_ms: u64 = "SWITCHYARD_STORE_ACK_TIMEOUT_MS", default 1000, check at_least_one;
    /// `on`: load the OWASP Core Rule Set for apps with a `waf` option, refusing to
    /// start if it cannot load; `off`: run without it (those apps follow `on_overload`).
    waf: String = "SWITCHYARD_WAF", default "on";
    /// The platform's own ModSecurity rules and CRS exclusions, included after the CRS
    /// (reloaded with `POST /v1/waf/reload`).
    waf_rules: String = "SWITCHYARD_WAF_RULES";
    /// Most disk, in MiB, that request bodies waiting for the WAF may use at once (in
    /// DATA_DIR/waf-spool); past it a body follows its app's `on_overload`.
    waf_spool_mb: u64 = "SWITCHYARD_WAF_SPOOL_MB", default 1024, check at_least_one;
    // No check: zero is a choice (read-ahead off), not a mistake.
    /// Most of one backend answer, in MiB, read ahead of a slow client (in memory, then in
    /// DATA_DIR/response-spool) so that the backend's connection is freed at the backend's
    /// speed; 0 turns read-ahead off. `text/event-stream` answers, those sent with
    /// `X-Accel-Buffering: no`, and apps with `"response_buffering": false` are never read
    /// ahead.
    response_buffer_mb: u64 = "SWITCHYARD_RESPONSE_BUFFER_MB", default 64;
    /// Most memory, in MiB, all answers read ahead may hold at once (at most 1 MiB each,
    /// the rest is spooled).
    response_buffer_memory_mb: u64 = "SWITCHYARD_RESPONSE_BUFFER_MEMORY_MB", default 256, check at_least_one;
    /// Most disk, in MiB, all answers read ahead may spool at once; past it and the memory
    /// budget, answers go on at their client's pace.
    response_spool_mb: u64 = "SWITCHYARD_RESPONSE_SPOOL_MB", default 1024, check at_least_one;
    /// KiB of one request's body kept in memory while it is read whole (request
    /// buffering); a larger body is spooled to a file in the data directory.
    request_buffer_kb: u64 = "SWITCHYARD_REQUEST_BUFFER_KB", default 64, check at_least_one;
    /// Most memory, in MiB, all request bodies being read whole may hold at once; a body
    /// that finds no room is answered 503 with `Retry-After`.
    request_buffer_memory_mb: u64 = "SWITCHYARD_REQUEST_BUFFER_MEMORY_MB", default 256, check at_least_one;
    /// Most disk, in MiB, all request bodies being read whole may spool at once; a body
    /// that finds no room is answered 503 with `Retry-After`.
    request_spool_mb: u64 = "SWITCHYARD_REQUEST_SPOOL_MB", default 1024, check at_least_one;
    /// The pace, in bytes a second, an upload read whole must keep once its grace period
    /// is over (it may take the grace plus a second per this many bytes), else 408; 0:
    /// none. An app may set its own (`request_buffering.min_rate_bytes`).
    request_body_min_rate: u64 = "SWITCHYARD_REQUEST_BODY_MIN_RATE", default 500;
    /// Seconds an upload read whole may take before its pace is counted.
    request_body_grace_s: u64 = "SWITCHYARD_REQUEST_BODY_GRACE_S", default 20;
    /// Seconds a whole request body may take to come in, whatever its pace, else 408. An
    /// app may set its own (`request_buffering.deadline_s`).
    request_body_deadline_s: u64 = "SWITCHYARD_REQUEST_BODY_DEADLINE_S", default 600, check at_least_one;
    /// CPU time, in milliseconds, one callback of an app's proxy-wasm filter may use
    /// before the filter is stopped (an app's filter may set its own, up to 1000).
    filter_deadline_ms: u64 = "SWITCHYARD_FILTER_DEADLINE_MS", default 10, check at_least_one;
    /// Memory, in MiB, one instance of a filter may grow to (an app's filter may set its
    /// own, up to 256).
    filter_memory_mb: u64 = "SWITCHYARD_FILTER_MEMORY_MB", default 16, check at_least_one;
    /// Instances of one app's filter kept per event-loop thread: requests share them
    /// between callbacks, and a new one starts only while all are running a callback.
    filter_instances: usize = "SWITCHYARD_FILTER_INSTANCES", default 4, check at_least_one;
    /// Apps shown by name in the per-app cost series (`switchyard_app_cpu_seconds_total`
    /// and its siblings): the costliest of the last minutes; every other app is summed
    /// as `app="_other"`.
    usage_top_apps: usize = "SWITCHYARD_USAGE_TOP_APPS", default 20, check at_least_one;
    /// `on`: each request's CPU is measured around the polls made for it and charged to
    /// its app (`switchyard_app_cpu_seconds_total`, `/v1/usage`, the access log's
    /// `cpu_us`); `off`: not measured (bytes, connections and requests are still counted).
    cpu_attribution: String = "SWITCHYARD_CPU_ATTRIBUTION", default "on";
    /// `on`: while an event loop is saturated, requests of apps above their share of the
    /// CPU (equal shares, or the apps' `cpu_weight`) wait behind the others' and past
    /// `--fair-share-queue-ms` are refused with 503; nothing changes while no loop is.
    /// Needs `--cpu-attribution on`.
    fair_share: String = "SWITCHYARD_FAIR_SHARE", default "on";
    /// An event loop is saturated while work waits on it longer than this (its probe's
    /// lag, in milliseconds) or it runs more than 90% of the time, and clear again below
    /// half of it and 80%.
    fair_share_lag_ms: u64 = "SWITCHYARD_FAIR_SHARE_LAG_MS", default 1, check at_least_one;
    /// How long, in milliseconds, a request over its app's share may wait for its turn
    /// before it is refused with 503 and `Retry-After`.
    fair_share_queue_ms: u64 = "SWITCHYARD_FAIR_SHARE_QUEUE_MS", default 1000, check at_least_one;
    /// Threads for CPU-bound stages such as the WAF (the number of cores).
    pool_threads: usize = "SWITCHYARD_POOL_THREADS", default cores(), check at_least_one;
    /// Most tasks waiting for those threads; more are refused at once.
    pool_queue: usize = "SWITCHYARD_POOL_QUEUE", default 1024, check at_least_one;
    /// How pool threads share the CPU with the event loops: `idle` (SCHED_IDLE, and while light requests are under way a worker pauses whenever other threads wait
    /// for a CPU) or `nice` (nice 10: workers keep a share of a host that other processes
    /// keep busy, and may delay light requests).
    pool_sched: String = "SWITCHYARD_POOL_SCHED", default "idle";
    /// Largest access-log batch in KiB (at most 64).
    log_batch_kb: usize = "SWITCHYARD_LOG_BATCH_KB", default 64, check batch_kib;
    /// Longest a record waits for its batch to fill, in milliseconds.
    log_batch_delay_ms: u64 = "SWITCHYARD_LOG_BATCH_DELAY_MS", default 200, check at_least_one;
    /// Memory for batches waiting for the log service, in MiB; past it they spool to disk.
    log_buffer_mb: usize = "SWITCHYARD_LOG_BUFFER_MB", default 16, check at_least_one;
    /// ACME directory URL (https://…): certificates are ordered for the domains of apps
    /// with `"tls": {"acme": true}`. Without it, no router of this one's store orders, but
    /// every router still answers the HTTP-01 challenges stored by one that does.
    acme_directory: String = "SWITCHYARD_ACME_DIRECTORY";
    /// Contact address of the fleet's ACME account.
    acme_email: String = "SWITCHYARD_ACME_EMAIL";
    /// External account binding key id (CAs that require one).
    acme_eab_kid: String = "SWITCHYARD_ACME_EAB_KID";
    /// External account binding HMAC key, base64url as the CA gives it.
    acme_eab_hmac: String = "SWITCHYARD_ACME_EAB_HMAC";
    /// PEM of a CA to trust for the ACME directory (a private ACME server).
    acme_ca_file: PathBuf = "SWITCHYARD_ACME_CA_FILE";
    /// Seconds between the issuer's rounds when no app changes (renewals, retries).
    acme_check_interval_s: u64 = "SWITCHYARD_ACME_CHECK_INTERVAL_S", default 3600, check at_least_one;
    /// Most new ACME orders per three hours, the CA's limit per account (Let's Encrypt's by
    /// default); past it, domains wait their turn.
    acme_orders_per_3h: usize = "SWITCHYARD_ACME_ORDERS_PER_3H", default switchyard_acme::LETS_ENCRYPT_ORDERS_PER_3H, check at_least_one;
    /// `http-01`: the CA checks the plain HTTP listener (port 80);
    /// `tls-alpn-01`: the HTTPS listener (port 443), for fleets whose port 80 is closed.
    acme_challenge: String = "SWITCHYARD_ACME_CHALLENGE", default "http-01";
    /// Directory of the on-disk spool (default: DATA_DIR/log-spool).
    log_spool_dir: PathBuf = "SWITCHYARD_LOG_SPOOL_DIR";
    /// Most disk the spool may use, in MiB; past it records are dropped and counted.
    log_spool_mb: u64 = "SWITCHYARD_LOG_SPOOL_MB", default 1024, check at_least_one;
}

/// A place in the config file's text.
pub(crate) type Span = std::ops::Range<usize>;

/// One setting after merging: the flag or environment value if given, else the file's (with
/// its place, for errors), else none; and its default, from the list.
pub(crate) struct Setting<T> {
    key: &'static str,
    /// The value given, if any.
    pub(crate) value: Option<T>,
    span: Option<Span>,
    default: Option<T>,
    check: Option<Check<T>>,
}

/// A check a settings-list entry names: what is wrong with a value, if anything.
type Check<T> = fn(&T) -> Result<(), String>;

/// Zero is refused (a count, a size, a duration).
fn at_least_one<T: PartialEq + From<u8>>(value: &T) -> Result<(), String> {
    if *value == T::from(0) {
        return Err("must be at least 1".into());
    }
    Ok(())
}

/// An access-log batch, in KiB: the log service's frame holds 64 at most.
fn batch_kib(value: &usize) -> Result<(), String> {
    at_least_one(value)?;
    if *value > 64 {
        return Err("at most 64 (KiB per batch)".into());
    }
    Ok(())
}

impl<T> Setting<T> {
    fn merge(
        key: &'static str,
        flag: Option<T>,
        file: Option<Spanned<T>>,
        default: Option<T>,
        check: Option<Check<T>>,
    ) -> Self {
        let (value, span) = match (flag, file) {
            (Some(value), _) => (Some(value), None),
            (None, Some(spanned)) => {
                let span = spanned.span();
                (Some(spanned.into_inner()), Some(span))
            }
            (None, None) => (None, None),
        };
        Self {
            key,
            value,
            span,
            default,
            check,
        }
    }

    /// The value given, or the default, through the entry's check.
    fn check(&self, source: &Source<'_>) -> anyhow::Result<()> {
        let (Some(check), Some(value)) =
            (self.check, self.value.as_ref().or(self.default.as_ref()))
        else {
            return Ok(());
        };
        check(value).map_err(|why| anyhow::anyhow!("{}: {why}", self.at(source)))
    }

    /// Where the value was given, for an error: the flag, or the file's line.
    pub(crate) fn at(&self, source: &Source<'_>) -> String {
        source.at(self.span.clone(), self.key)
    }

    /// The value given, else the list's default (a setting without one is refused, naming
    /// it, rather than read as anything).
    pub(crate) fn resolved(self) -> anyhow::Result<T> {
        match self.value.or(self.default) {
            Some(value) => Ok(value),
            None => bail!("{}: has no value and no default", self.key),
        }
    }
}

impl Setting<u64> {
    /// A size given in MiB, in bytes.
    pub(crate) fn mebibytes(self) -> anyhow::Result<u64> {
        Ok(self.resolved()?.saturating_mul(1 << 20))
    }

    /// A duration given in whole seconds.
    pub(crate) fn seconds(self) -> anyhow::Result<Duration> {
        Ok(Duration::from_secs(self.resolved()?))
    }

    /// A duration given in milliseconds.
    pub(crate) fn millis(self) -> anyhow::Result<Duration> {
        Ok(Duration::from_millis(self.resolved()?))
    }
}

impl Setting<String> {
    /// An `ip:port` address, or `None` for `off` (given, or the default).
    pub(crate) fn address_or_off(self, source: &Source<'_>) -> anyhow::Result<Option<SocketAddr>> {
        let off = self.value.as_deref().or(self.default.as_deref()) == Some("off");
        if off {
            return Ok(None);
        }
        self.address(source).map(Some)
    }

    /// An `ip:port` address.
    pub(crate) fn address(self, source: &Source<'_>) -> anyhow::Result<SocketAddr> {
        let at = self.at(source);
        let text = self.resolved()?;
        text.parse().map_err(|_| {
            anyhow::anyhow!("{at}: '{text}' is not an ip:port address (e.g. 0.0.0.0:8080)")
        })
    }

    /// Whether the value is `on` (else `off`; anything else is refused).
    pub(crate) fn on_off(self, source: &Source<'_>) -> anyhow::Result<bool> {
        self.choice(source, &[("on", true), ("off", false)])
    }

    /// Which of `choices` (text, meaning) the value names.
    pub(crate) fn choice<C: Copy>(
        self,
        source: &Source<'_>,
        choices: &[(&str, C)],
    ) -> anyhow::Result<C> {
        let at = self.at(source);
        let text = self.resolved()?;
        match choices.iter().find(|(name, _)| *name == text) {
            Some((_, meaning)) => Ok(*meaning),
            None => {
                let names: Vec<String> = choices.iter().map(|(n, _)| format!("`{n}`")).collect();
                bail!("{at}: '{text}' is not one of {}", names.join(", "))
            }
        }
    }
}

/// A default as written in the settings list, made the setting's type.
trait IntoDefault<T> {
    fn into_default(self) -> T;
}

impl<T> IntoDefault<T> for T {
    fn into_default(self) -> T {
        self
    }
}

impl IntoDefault<String> for &str {
    fn into_default(self) -> String {
        self.to_string()
    }
}

impl IntoDefault<PathBuf> for &str {
    fn into_default(self) -> PathBuf {
        PathBuf::from(self)
    }
}

/// A default as `--help` shows it.
trait Shown {
    fn shown(&self) -> String;
}

impl Shown for String {
    fn shown(&self) -> String {
        self.clone()
    }
}

impl Shown for PathBuf {
    fn shown(&self) -> String {
        self.display().to_string()
    }
}

macro_rules! shown_as_displayed {
    ($($kind:ty),*) => {
        $(impl Shown for $kind {
            fn shown(&self) -> String {
                self.to_string()
            }
        })*
    };
}

shown_as_displayed!(u16, u64, usize);

/// What a text setting holds, as its documentation says; "text" for a name not listed
/// (a test insists every text setting is).
fn text_type(key: &str) -> &'static str {
    match key {
        "http" | "admin" => "address (IP:PORT)",
        "https" | "http3" | "metrics" => "address (IP:PORT) or `off`",
        "http3_early_data" | "admin_ui_writes" | "waf" | "cpu_attribution" | "fair_share" => {
            "`on` or `off`"
        }
        "store" => "`embedded` or Redis URL",
        "store_ack_replicas" => "`auto` or a number of replicas",
        "cache_redis" => "Redis URL",
        "access_log" => "`stdout`, `off` or path",
        "trusted_proxies" => "list of CIDRs",
        "dns_servers" => "list of IP:PORT",
        "waf_rules" => "path",
        "pool_sched" => "`idle` or `nice`",
        "acme_directory" => "URL",
        "acme_email" => "email address",
        "acme_challenge" => "`http-01` or `tls-alpn-01`",
        "admin_token" | "acme_eab_hmac" => "secret",
        "acme_eab_kid" => "key identifier",
        _ => "text",
    }
}

/// A default as the reference shows it: a default computed on the machine (`cores()`) is
/// named by its expression, not by this machine's value.
fn reference_default(expression: &str, value: String) -> String {
    if expression.ends_with(')') {
        expression.to_string()
    } else {
        value
    }
}

/// One setting as the reference shows it.
#[derive(Debug, Clone)]
pub struct SettingDoc {
    /// Its name; the flag is `--` and the name with `-` for `_`.
    pub key: &'static str,
    /// The environment variable (empty for a flag of the command line only).
    pub env: String,
    /// The value's type, as declared.
    pub kind: &'static str,
    /// Whether the config file takes it, under `key`.
    pub in_file: bool,
    /// The default, as `--help` shows it.
    pub default: Option<String>,
    /// What it does.
    pub doc: String,
}

impl SettingDoc {
    fn new(
        key: &'static str,
        env: String,
        kind: &'static str,
        in_file: bool,
        default: Option<String>,
        doc: &str,
    ) -> Self {
        Self {
            key,
            env,
            kind,
            in_file,
            default,
            doc: doc.split_whitespace().collect::<Vec<_>>().join(" "),
        }
    }

    /// The value's type as an operator reads it: the unit a number counts in, what a text
    /// names.
    pub fn operator_type(&self) -> &'static str {
        let key = self.key;
        match self.kind {
            "PathBuf" | "path" => "path",
            "u16" => "port",
            "u64" | "usize" => [
                ("_ms", "milliseconds"),
                ("_s", "seconds"),
                ("_mb", "MiB"),
                ("_kb", "KiB"),
                ("_bytes", "bytes"),
            ]
            .iter()
            .find(|(suffix, _)| key.ends_with(suffix))
            .map_or("number", |(_, unit)| unit),
            "String" => text_type(key),
            other => other,
        }
    }

    /// A flag of `serve` that is no ordinary setting, as clap has it declared.
    fn of_flag(
        serve: &clap::Command,
        key: &'static str,
        kind: &'static str,
        in_file: bool,
    ) -> Self {
        let arg = serve.get_arguments().find(|arg| arg.get_id() == key);
        let env = arg
            .and_then(clap::Arg::get_env)
            .map(|env| env.to_string_lossy().into_owned())
            .unwrap_or_default();
        let doc = arg
            .and_then(clap::Arg::get_help)
            .map(ToString::to_string)
            .unwrap_or_default();
        Self::new(key, env, kind, in_file, None, &doc)
    }

    /// The command-line flag.
    pub fn flag(&self) -> String {
        format!("--{}", self.key.replace('_', "-"))
    }
}

/// A setting's `--help`: its doc, and its default when it has one.
fn help_text(doc: &str, default: Option<String>) -> String {
    let doc = doc.trim();
    match default {
        Some(default) => format!("{doc} [default: {default}]"),
        None => doc.to_string(),
    }
}

/// The number of cores, the default of the thread counts.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(2, usize::from)
}
