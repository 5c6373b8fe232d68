//! `switchyard bench-seed`: fills an embedded store with many generated apps in a few large
//! transactions, so benchmarks can start a router over 100,000 apps in seconds instead of
//! issuing 100,000 fsynced API writes. Run it before the router starts.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde_json::json;
use switchyard_model::parse_app_spec;
use switchyard_store::EmbeddedStore;

const BATCH: usize = 10_000;

/// Options of `switchyard bench-seed`.
#[derive(Args)]
pub(crate) struct SeedArgs {
    /// Directory of the embedded store to fill.
    #[arg(long)]
    data_dir: PathBuf,
    /// Number of apps: app{i}, with domain app{i}.{suffix}, i from 0.
    #[arg(long)]
    apps: usize,
    /// Domain suffix of the generated apps.
    #[arg(long, default_value = "bench")]
    suffix: String,
    /// A backend of every app (repeatable).
    #[arg(long = "backend", required = true)]
    backends: Vec<String>,
}

/// Writes the apps and reports how many were stored.
pub(crate) fn run(args: SeedArgs) -> anyhow::Result<()> {
    let store = EmbeddedStore::open(&args.data_dir)
        .with_context(|| format!("cannot open the store in {}", args.data_dir.display()))?;
    let mut batch = Vec::with_capacity(BATCH);
    for i in 0..args.apps {
        let spec =
            json!({"domains": [format!("app{i}.{}", args.suffix)], "backends": args.backends});
        batch.push(parse_app_spec(&format!("app{i}"), &spec).map_err(|e| anyhow::anyhow!("{e}"))?);
        if batch.len() == BATCH || i + 1 == args.apps {
            store.import_apps(&batch)?;
            batch.clear();
        }
    }
    println!("stored {} apps in {}", args.apps, args.data_dir.display());
    Ok(())
}
