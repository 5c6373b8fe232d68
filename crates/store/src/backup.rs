//! Backups of the embedded store: a consistent copy taken while the router serves, and its
//! restore into a data directory whose router is stopped. A copy is a redb file of its own,
//! made from one read transaction: redb's readers see one committed state, so the copy
//! holds every write acknowledged before it began and none of one that ends after, and
//! writers go on meanwhile.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use redb::{
    Database, DatabaseError, ReadTransaction, ReadableTable, ReadableTableMetadata,
    TableDefinition, WriteTransaction,
};

use crate::embedded::{
    decode_app, unavailable, ACME, APPS, AUDIT, CERTS, CERT_EXPIRY, CERT_INFO, DOMAINS, FILE_NAME,
    SECRETS, TOKENS,
};
use crate::StoreError;

/// What a backup holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackupContents {
    /// Apps.
    pub apps: u64,
    /// Certificates (with their keys).
    pub certificates: u64,
}

/// A copy of the store, ready to be sent: an open file already removed from the directory,
/// so nothing is left behind if the router stops while sending it.
#[derive(Debug)]
pub struct Backup {
    /// The copy, read from its start.
    pub file: File,
    /// Its size in bytes.
    pub bytes: u64,
    /// What it holds.
    pub contents: BackupContents,
}

/// Copies `db` into a new file in `dir`, opens it and removes its name.
pub(crate) fn snapshot(db: &Database, dir: &Path) -> Result<Backup, StoreError> {
    let read = db.begin_read().map_err(unavailable)?;
    let path = dir.join(format!(
        ".{FILE_NAME}.backup-{}-{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let copied = copy_into(&read, &path);
    let opened = copied.and_then(|contents| {
        let file = File::open(&path).map_err(|e| io_error(&path, &e))?;
        let bytes = file.metadata().map_err(|e| io_error(&path, &e))?.len();
        Ok(Backup {
            file,
            bytes,
            contents,
        })
    });
    // Removed whatever happened: an open copy stays readable through its descriptor.
    let _ = std::fs::remove_file(&path);
    opened
}

/// Writes every table of `read` into a new redb file at `path`.
fn copy_into(read: &ReadTransaction, path: &Path) -> Result<BackupContents, StoreError> {
    let copy = Database::create(path).map_err(|e| io_error(path, &e))?;
    let write = copy.begin_write().map_err(unavailable)?;
    let apps = copy_table(read, &write, APPS)?;
    copy_table(read, &write, DOMAINS)?;
    let certificates = copy_table(read, &write, CERTS)?;
    copy_table(read, &write, CERT_INFO)?;
    copy_table(read, &write, CERT_EXPIRY)?;
    copy_table(read, &write, ACME)?;
    copy_table(read, &write, SECRETS)?;
    copy_table(read, &write, TOKENS)?;
    copy_table(read, &write, AUDIT)?;
    write.commit().map_err(unavailable)?;
    Ok(BackupContents { apps, certificates })
}

fn copy_table<V: redb::Value + 'static>(
    read: &ReadTransaction,
    write: &WriteTransaction,
    definition: TableDefinition<&str, V>,
) -> Result<u64, StoreError> {
    let from = read.open_table(definition).map_err(unavailable)?;
    let mut to = write.open_table(definition).map_err(unavailable)?;
    let mut copied = 0;
    for entry in from.iter().map_err(unavailable)? {
        let (key, value) = entry.map_err(unavailable)?;
        to.insert(key.value(), value.value()).map_err(unavailable)?;
        copied += 1;
    }
    Ok(copied)
}

/// Reads a backup through: every table there, every app decodable. A file that is not a
/// backup of this store is refused before anything is replaced.
pub fn inspect(backup: &Path) -> Result<BackupContents, StoreError> {
    let db = Database::open(backup).map_err(|e| {
        StoreError::Unavailable(format!(
            "{} is not a Switchyard store: {e}",
            backup.display()
        ))
    })?;
    let read = db.begin_read().map_err(unavailable)?;
    let missing = |table: &str, e: redb::TableError| {
        StoreError::Unavailable(format!(
            "{} is not a Switchyard store (table {table}: {e})",
            backup.display()
        ))
    };
    let apps = read.open_table(APPS).map_err(|e| missing("apps", e))?;
    for entry in apps.iter().map_err(unavailable)? {
        let (name, value) = entry.map_err(unavailable)?;
        decode_app(name.value(), value.value())?;
    }
    let certificates = read.open_table(CERTS).map_err(|e| missing("certs", e))?;
    read.open_table(DOMAINS)
        .map_err(|e| missing("domains", e))?;
    read.open_table(CERT_INFO)
        .map_err(|e| missing("cert_info", e))?;
    read.open_table(ACME).map_err(|e| missing("acme", e))?;
    read.open_table(SECRETS)
        .map_err(|e| missing("secrets", e))?;
    Ok(BackupContents {
        apps: apps.len().map_err(unavailable)?,
        certificates: certificates.len().map_err(unavailable)?,
    })
}

/// What a restore did.
#[derive(Debug)]
pub struct Restored {
    /// What the restored store holds.
    pub contents: BackupContents,
    /// Where the store it replaced was kept.
    pub previous: PathBuf,
}

/// Puts `backup` in place as the store of `data_dir`, keeping the store it replaces beside
/// it. Refused while a router serves from `data_dir` (redb locks its file to one process):
/// the router holds the store in memory and would go on writing the one it opened.
pub fn restore(backup: &Path, data_dir: &Path) -> Result<Restored, StoreError> {
    let contents = inspect(backup)?;
    std::fs::create_dir_all(data_dir).map_err(|e| io_error(data_dir, &e))?;
    let live = data_dir.join(FILE_NAME);
    // Held until the restored file is in place, so no router opens the old one meanwhile.
    let _held = match Database::create(&live) {
        Ok(db) => db,
        Err(DatabaseError::DatabaseAlreadyOpen) => {
            return Err(StoreError::Unavailable(format!(
                "a router is serving from {}: stop it first (`systemctl stop switchyard`), \
                 restore, then start it",
                live.display()
            )))
        }
        Err(e) => return Err(io_error(&live, &e)),
    };
    let staged = data_dir.join(format!(".{FILE_NAME}.restoring"));
    copy_file_synced(backup, &staged)?;
    // Owned as the store it replaces: a router running as its own user (systemd's
    // DynamicUser) must be able to open it.
    let owner = std::fs::metadata(&live).map_err(|e| io_error(&live, &e))?;
    std::os::unix::fs::chown(&staged, Some(owner.uid()), Some(owner.gid()))
        .map_err(|e| io_error(&staged, &e))?;
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let previous = data_dir.join(format!("{FILE_NAME}.before-restore-{stamp}"));
    std::fs::rename(&live, &previous).map_err(|e| io_error(&live, &e))?;
    std::fs::rename(&staged, &live).map_err(|e| io_error(&staged, &e))?;
    File::open(data_dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| io_error(data_dir, &e))?;
    Ok(Restored { contents, previous })
}

/// Copies `from` to `to` (private to its owner) and syncs it to disk.
fn copy_file_synced(from: &Path, to: &Path) -> Result<(), StoreError> {
    let mut source = File::open(from).map_err(|e| io_error(from, &e))?;
    let mut target = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(to)
        .map_err(|e| io_error(to, &e))?;
    std::io::copy(&mut source, &mut target).map_err(|e| io_error(to, &e))?;
    target.flush().map_err(|e| io_error(to, &e))?;
    target.sync_all().map_err(|e| io_error(to, &e))
}

fn io_error(path: &Path, e: &dyn std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("{}: {e}", path.display()))
}
