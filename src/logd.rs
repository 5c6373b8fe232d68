//! `switchyard logd`: flags of the log service, validated, handed to `switchyard_logs`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use switchyard_logs::{FilePolicy, LogdConfig, SyncPolicy};

/// Flags of `switchyard logd`; each may also be set as `SWITCHYARD_LOGD_<FLAG>`.
#[derive(Args, Debug)]
pub(crate) struct LogdArgs {
    /// Address routers send batches to.
    #[arg(long, env = "SWITCHYARD_LOGD_LISTEN", default_value = "127.0.0.1:8514")]
    listen: SocketAddr,
    /// Directory of the per-app files (`DIR/APP/access.log`).
    #[arg(long, env = "SWITCHYARD_LOGD_DIR", default_value = "./switchyard-logs")]
    dir: PathBuf,
    /// Rotate a file before it grows past this many MiB.
    #[arg(long, env = "SWITCHYARD_LOGD_ROTATE_MB", default_value_t = 100)]
    rotate_mb: u64,
    /// Also rotate a file this many seconds after it was started (0: only by size).
    #[arg(
        long,
        env = "SWITCHYARD_LOGD_ROTATE_INTERVAL_S",
        default_value_t = 86_400
    )]
    rotate_interval_s: u64,
    /// Rotated files kept per app.
    #[arg(long, env = "SWITCHYARD_LOGD_KEEP", default_value_t = 7)]
    keep: usize,
    /// Gzip rotated files.
    #[arg(long, env = "SWITCHYARD_LOGD_GZIP")]
    gzip: bool,
    /// `always`: sync before acknowledging (acknowledged lines survive a power loss);
    /// `never`: leave it to the kernel (they survive a crash of logd, not of the machine).
    #[arg(long, env = "SWITCHYARD_LOGD_FSYNC", default_value = "always")]
    fsync: String,
    /// Most files open at once.
    #[arg(long, env = "SWITCHYARD_LOGD_MAX_OPEN_FILES", default_value_t = 512)]
    max_open_files: usize,
    /// Prometheus metrics address (`/metrics`), off when not given.
    #[arg(long, env = "SWITCHYARD_LOGD_METRICS")]
    metrics: Option<SocketAddr>,
}

/// Runs the log service until SIGTERM.
pub(crate) fn run(args: LogdArgs) -> anyhow::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .target(env_logger::Target::Stderr)
        .init();
    crate::limits::raise_open_file_limit();
    let sync = match args.fsync.as_str() {
        "always" => SyncPolicy::Always,
        "never" => SyncPolicy::Never,
        other => bail!("--fsync: '{other}' is not `always` or `never`"),
    };
    if args.rotate_mb == 0 {
        bail!("--rotate-mb: must be at least 1");
    }
    let config = LogdConfig {
        listen: args.listen,
        dir: args.dir.clone(),
        files: FilePolicy {
            rotate_bytes: args.rotate_mb.saturating_mul(1 << 20),
            rotate_interval: (args.rotate_interval_s > 0)
                .then(|| Duration::from_secs(args.rotate_interval_s)),
            keep: args.keep,
            gzip: args.gzip,
            max_open: args.max_open_files.max(1),
        },
        sync,
        metrics: args.metrics,
    };
    switchyard_logs::run_logd(config)
        .with_context(|| format!("logd on {} writing to {}", args.listen, args.dir.display()))
}
