//! `switchyard store …`: a consistent backup of the embedded store taken through the admin
//! API while the router serves, its restore into a stopped router's data directory, and
//! where the store stands.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::{AdminClient, AdminOptions};

/// `switchyard store` and its subcommands.
#[derive(Args)]
pub(crate) struct StoreArgs {
    #[command(flatten)]
    admin: AdminOptions,
    #[command(subcommand)]
    command: StoreCommand,
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Save a consistent copy of the running router's embedded store to FILE (the router
    /// goes on serving and taking writes). A Redis store is backed up by Redis itself.
    Backup {
        /// Where to write the copy; replaced only once the whole copy is on disk.
        file: PathBuf,
    },
    /// Put a backup in place as the store of a stopped router (the store replaced is kept
    /// beside it as switchyard.redb.before-restore-TIME). Refused while a router serves
    /// from DATA_DIR. No admin API needed.
    Restore {
        /// A file written by `switchyard store backup`.
        file: PathBuf,
        /// The router's data directory.
        #[arg(long, env = "SWITCHYARD_DATA_DIR", default_value = "./switchyard-data")]
        data_dir: PathBuf,
    },
    /// The store's kind, location and, for Redis, the subscription and last revision.
    Status,
}

/// Runs one store command.
pub(crate) fn run(args: StoreArgs) -> ExitCode {
    let result = match &args.command {
        StoreCommand::Backup { file } => backup(&AdminClient::new(&args.admin), file),
        StoreCommand::Restore { file, data_dir } => restore(file, data_dir),
        StoreCommand::Status => AdminClient::new(&args.admin)
            .call("GET", "/v1/store", None)
            .map(|status| (describe(&status), status)),
    };
    args.admin.report(result)
}

fn backup(client: &AdminClient, file: &Path) -> Result<(String, Value), String> {
    let response = client
        .request("GET", "/v1/store/backup")
        .call()
        .map_err(|e| client.failure(e))?;
    let announced = |name: &str| response.header(name).and_then(|v| v.parse::<u64>().ok());
    let (apps, certificates) = (
        announced("x-switchyard-apps"),
        announced("x-switchyard-certificates"),
    );
    let partial = with_suffix(file, ".partial");
    let written = save(response.into_reader(), &partial).and_then(|bytes| {
        // Read back before it replaces anything: a cut transfer is not a backup.
        let contents = switchyard_store::inspect_backup(&partial).map_err(|e| e.to_string())?;
        if Some(contents.apps) != apps || Some(contents.certificates) != certificates {
            return Err(format!(
                "the copy received holds {} apps and {} certificates, the router sent {apps:?} \
                 and {certificates:?}",
                contents.apps, contents.certificates
            ));
        }
        std::fs::rename(&partial, file).map_err(|e| format!("{}: {e}", file.display()))?;
        Ok((bytes, contents))
    });
    let (bytes, contents) = written.inspect_err(|_| {
        let _ = std::fs::remove_file(&partial);
    })?;
    Ok((
        format!(
            "{}: {} apps, {} certificates ({bytes} bytes)",
            file.display(),
            contents.apps,
            contents.certificates
        ),
        json!({
            "file": file.display().to_string(),
            "bytes": bytes,
            "apps": contents.apps,
            "certificates": contents.certificates,
        }),
    ))
}

/// Writes `body` to `path` (private to its owner) and syncs it; returns its size.
fn save(mut body: impl std::io::Read, path: &Path) -> Result<u64, String> {
    let failed = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut out = std::os::unix::fs::OpenOptionsExt::mode(
        File::options().write(true).create(true).truncate(true),
        0o600,
    )
    .open(path)
    .map_err(failed)?;
    let bytes = std::io::copy(&mut body, &mut out).map_err(failed)?;
    out.flush().map_err(failed)?;
    out.sync_all().map_err(failed)?;
    Ok(bytes)
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn restore(file: &Path, data_dir: &Path) -> Result<(String, Value), String> {
    let restored = switchyard_store::restore(file, data_dir).map_err(|e| e.to_string())?;
    Ok((
        format!(
            "restored {} apps and {} certificates into {} (the store replaced is kept as {})",
            restored.contents.apps,
            restored.contents.certificates,
            data_dir.display(),
            restored.previous.display()
        ),
        json!({
            "apps": restored.contents.apps,
            "certificates": restored.contents.certificates,
            "previous": restored.previous.display().to_string(),
        }),
    ))
}

fn describe(status: &Value) -> String {
    let mut text = format!(
        "{} store at {}: {}",
        status["kind"].as_str().unwrap_or("?"),
        status["location"].as_str().unwrap_or("?"),
        if status["available"].as_bool() == Some(true) {
            "available"
        } else {
            "unavailable"
        }
    );
    if let Some(primary) = status["primary"].as_str() {
        text.push_str(&format!("\nprimary: {primary}"));
    }
    if let Some(subscribed) = status["subscribed"].as_bool() {
        text.push_str(&format!("\nsubscribed to changes: {subscribed}"));
    }
    if let Some(revision) = status["last_revision"].as_i64() {
        text.push_str(&format!("\nlast revision seen: {revision}"));
    }
    if let Some(seconds) = status["seconds_since_last_sync"].as_i64() {
        text.push_str(&format!("\nin step {seconds} s ago"));
    }
    text
}
