//! `logd`'s files: `DIR/APP/access.log` per app, rotated by size and by age into
//! `access.log.1`, `.2`… (optionally gzipped), keeping a fixed number; handles are reopened
//! on request (SIGHUP, after an external logrotate) and bounded in number.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::metrics;

const FILE_NAME: &str = "access.log";
/// Lines of hosts no app owns (404s) go to this directory.
const UNROUTED: &str = "_unrouted";
/// Lines naming something that cannot be a directory name go here.
const INVALID: &str = "_invalid";
/// Threads syncing files at once.
const SYNC_THREADS: usize = 16;

/// How files are rotated and synced.
#[derive(Debug, Clone)]
pub struct FilePolicy {
    /// Rotate a file before it grows past this.
    pub rotate_bytes: u64,
    /// Rotate a file this long after it was started (`None`: never by age).
    pub rotate_interval: Option<Duration>,
    /// Rotated files kept per app.
    pub keep: usize,
    /// Compress rotated files.
    pub gzip: bool,
    /// Most files open at once; the least recently written is closed first.
    pub max_open: usize,
}

struct OpenFile {
    file: File,
    bytes: u64,
    started: Instant,
    last_write: u64,
    unsynced: bool,
}

/// The per-app files of one directory.
pub(crate) struct AppFiles {
    dir: PathBuf,
    policy: FilePolicy,
    open: HashMap<String, OpenFile>,
    writes: u64,
}

impl AppFiles {
    /// Files under `dir` (created if missing).
    pub(crate) fn new(dir: &Path, policy: FilePolicy) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            policy,
            open: HashMap::new(),
            writes: 0,
        })
    }

    /// Appends `lines` (whole, newline-terminated) to `app`'s file, rotating it first if they
    /// would take it past the size limit.
    pub(crate) fn append(&mut self, app: &str, lines: &[u8]) -> io::Result<()> {
        let name = directory_name(app);
        self.writes += 1;
        let writes = self.writes;
        if !self.open.contains_key(name) {
            self.close_least_recent_if_full();
            let file = self.open_file(name)?;
            self.open.insert(name.to_string(), file);
        }
        let needs_rotation = self.open.get(name).is_some_and(|f| {
            f.bytes > 0 && f.bytes + lines.len() as u64 > self.policy.rotate_bytes
        });
        if needs_rotation {
            self.rotate(name, "size")?;
        }
        let Some(open) = self.open.get_mut(name) else {
            return Err(io::Error::other("file vanished"));
        };
        open.file.write_all(lines)?;
        open.bytes += lines.len() as u64;
        open.last_write = writes;
        open.unsynced = true;
        let line_count = lines.iter().filter(|&&b| b == b'\n').count() as u64;
        metrics::LOGD_LINES
            .with_label_values(&[name])
            .inc_by(line_count);
        metrics::LOGD_BYTES
            .with_label_values(&[name])
            .inc_by(lines.len() as u64);
        Ok(())
    }

    /// Flushes written data to disk (at shutdown).
    pub(crate) fn sync(&mut self) -> io::Result<()> {
        sync_concurrently(self.take_unsynced()?)
    }

    /// Handles (duplicated descriptors) of the files written since the last call, for
    /// another thread to sync while this one writes on.
    pub(crate) fn take_unsynced(&mut self) -> io::Result<Vec<File>> {
        let mut handles = Vec::new();
        for open in self.open.values_mut().filter(|o| o.unsynced) {
            handles.push(open.file.try_clone()?);
            open.unsynced = false;
        }
        Ok(handles)
    }

    /// Rotates every open file older than the rotation interval.
    pub(crate) fn rotate_aged(&mut self) -> io::Result<()> {
        let Some(interval) = self.policy.rotate_interval else {
            return Ok(());
        };
        let aged: Vec<String> = self
            .open
            .iter()
            .filter(|(_, f)| f.bytes > 0 && f.started.elapsed() >= interval)
            .map(|(name, _)| name.clone())
            .collect();
        for name in aged {
            self.rotate(&name, "time")?;
        }
        Ok(())
    }

    /// Closes every file; the next write opens `access.log` anew (after logrotate moved it).
    pub(crate) fn reopen_all(&mut self) -> io::Result<()> {
        self.sync()?;
        self.open.clear();
        Ok(())
    }

    fn open_file(&self, name: &str) -> io::Result<OpenFile> {
        let dir = self.dir.join(name);
        std::fs::create_dir_all(&dir)?;
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(dir.join(FILE_NAME))?;
        let bytes = cut_torn_tail(&mut file)?;
        Ok(OpenFile {
            file,
            bytes,
            // A file found on disk is as old as this process knows; age counts from here.
            started: Instant::now(),
            last_write: 0,
            unsynced: false,
        })
    }

    fn close_least_recent_if_full(&mut self) {
        if self.open.len() < self.policy.max_open.max(1) {
            return;
        }
        if let Some(oldest) = self
            .open
            .iter()
            .min_by_key(|(_, f)| f.last_write)
            .map(|(name, _)| name.clone())
        {
            if let Some(file) = self.open.remove(&oldest) {
                if file.unsynced {
                    let _ = file.file.sync_data();
                }
            }
        }
    }

    fn rotate(&mut self, name: &str, reason: &str) -> io::Result<()> {
        if let Some(open) = self.open.remove(name) {
            // What was acknowledged stays durable across the rename.
            open.file.sync_data()?;
        }
        let dir = self.dir.join(name);
        let suffix = if self.policy.gzip { ".gz" } else { "" };
        let rotated = |n: usize| dir.join(format!("{FILE_NAME}.{n}{suffix}"));
        let keep = self.policy.keep;
        // Claimed by a rename first: an external logrotate moving the same file at the same
        // moment either finds it gone or leaves nothing here, so its lines end up in one
        // place, never in both (gzipping from the live name did copy them twice).
        let claimed = dir.join(format!("{FILE_NAME}.rotating"));
        match std::fs::rename(dir.join(FILE_NAME), &claimed) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let file = self.open_file(name)?;
                self.open.insert(name.to_string(), file);
                return Ok(());
            }
            claim => claim?,
        }
        remove_if_present(&rotated(keep + 1))?;
        if keep == 0 {
            remove_if_present(&claimed)?;
        } else {
            remove_if_present(&rotated(keep))?;
            for n in (1..keep).rev() {
                rename_if_present(&rotated(n), &rotated(n + 1))?;
            }
            if self.policy.gzip {
                gzip_into(&claimed, &rotated(1))?;
                std::fs::remove_file(&claimed)?;
            } else {
                std::fs::rename(&claimed, rotated(1))?;
            }
        }
        metrics::LOGD_ROTATIONS.with_label_values(&[reason]).inc();
        let file = self.open_file(name)?;
        self.open.insert(name.to_string(), file);
        Ok(())
    }
}

/// Syncs `files` concurrently: the filesystem's journal then commits them together rather
/// than once per file (one after the other, 50 apps' files took longer than their writes).
pub(crate) fn sync_concurrently(files: Vec<File>) -> io::Result<()> {
    if files.len() <= 1 {
        return files.iter().try_for_each(File::sync_data);
    }
    let per_thread = files.len().div_ceil(SYNC_THREADS);
    std::thread::scope(|scope| {
        let syncing: Vec<_> = files
            .chunks(per_thread)
            .map(|chunk| scope.spawn(move || chunk.iter().try_for_each(File::sync_data)))
            .collect();
        syncing.into_iter().try_for_each(|thread| {
            thread
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("a sync thread panicked")))
        })
    })
}

/// Cuts a line left unfinished at the end of `file` and returns the file's length after it.
/// Only a logd killed mid-write leaves one; its batch was not acknowledged, so the router
/// sends it again, and without the cut the resent first line would be glued to the torn one.
fn cut_torn_tail(file: &mut File) -> io::Result<u64> {
    let length = file.metadata()?.len();
    let mut end = length;
    let mut chunk = [0u8; 4096];
    while end > 0 {
        let start = end.saturating_sub(chunk.len() as u64);
        let part = &mut chunk[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(part)?;
        if let Some(newline) = part.iter().rposition(|&b| b == b'\n') {
            end = start + newline as u64 + 1;
            break;
        }
        end = start;
    }
    if end < length {
        file.set_len(end)?;
        metrics::LOGD_TORN_TAILS.inc();
        log::warn!(
            "cut {} bytes of an unfinished line left by a crash",
            length - end
        );
    }
    Ok(end)
}

/// The directory for `app`: app names are plain already; anything else is kept apart
/// rather than trusted as a path.
fn directory_name(app: &str) -> &str {
    if app.is_empty() {
        return UNROUTED;
    }
    if app == crate::AUDIT_STREAM {
        return crate::AUDIT_STREAM;
    }
    let plain = app.len() <= 128
        && !app.starts_with('.')
        && !app.starts_with('_')
        && app
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if plain {
        app
    } else {
        INVALID
    }
}

fn gzip_into(source: &Path, target: &Path) -> io::Result<()> {
    let partial = target.with_extension("gz.partial");
    {
        let mut input = File::open(source)?;
        let output = File::create(&partial)?;
        let mut encoder = flate2::write::GzEncoder::new(output, flate2::Compression::fast());
        io::copy(&mut input, &mut encoder)?;
        encoder.finish()?.sync_all()?;
    }
    std::fs::rename(partial, target)
}

fn remove_if_present(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn rename_if_present(from: &Path, to: &Path) -> io::Result<()> {
    match std::fs::rename(from, to) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(rotate_bytes: u64, keep: usize, gzip: bool) -> FilePolicy {
        FilePolicy {
            rotate_bytes,
            rotate_interval: None,
            keep,
            gzip,
            max_open: 2,
        }
    }

    fn read(path: PathBuf) -> String {
        std::fs::read_to_string(path).expect("readable")
    }

    #[test]
    fn size_rotation_keeps_n_files_and_loses_no_line() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut files = AppFiles::new(dir.path(), policy(10, 2, false)).expect("files");
        for n in 0..5 {
            files
                .append("shop", format!("line {n}\n").as_bytes())
                .expect("append");
        }
        let app = dir.path().join("shop");
        assert_eq!(read(app.join("access.log")), "line 4\n");
        assert_eq!(read(app.join("access.log.1")), "line 3\n");
        assert_eq!(read(app.join("access.log.2")), "line 2\n");
        assert!(!app.join("access.log.3").exists(), "only 2 are kept");
    }

    #[test]
    fn rotated_files_can_be_gzipped_and_odd_names_stay_inside_the_directory() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut files = AppFiles::new(dir.path(), policy(8, 3, true)).expect("files");
        files.append("shop", b"first\n").expect("append");
        files.append("shop", b"second\n").expect("append");
        let mut text = String::new();
        let gz = File::open(dir.path().join("shop/access.log.1.gz")).expect("gz");
        io::Read::read_to_string(&mut flate2::read::GzDecoder::new(gz), &mut text).expect("gunzip");
        assert_eq!(text, "first\n");

        files.append("../../etc", b"x\n").expect("append");
        files.append("", b"y\n").expect("append");
        files
            .append("a", b"z\n")
            .expect("append, closing one of two open files");
        assert_eq!(read(dir.path().join("_invalid/access.log")), "x\n");
        assert_eq!(read(dir.path().join("_unrouted/access.log")), "y\n");
        assert_eq!(read(dir.path().join("a/access.log")), "z\n");
    }

    #[test]
    fn an_unfinished_last_line_is_cut_before_the_next_write() {
        let dir = tempfile::tempdir().expect("temp dir");
        let app = dir.path().join("shop");
        std::fs::create_dir_all(&app).expect("app dir");
        let whole = "x".repeat(5000);
        let torn = "y".repeat(9000);
        std::fs::write(app.join("access.log"), format!("{whole}\n{torn}")).expect("write");
        let mut files = AppFiles::new(dir.path(), policy(1 << 20, 2, false)).expect("files");
        files.append("shop", b"resent\n").expect("append");
        assert_eq!(read(app.join("access.log")), format!("{whole}\nresent\n"));

        std::fs::write(dir.path().join("shop/access.log"), "no newline at all").expect("write");
        files.reopen_all().expect("reopen");
        files.append("shop", b"first\n").expect("append");
        assert_eq!(read(app.join("access.log")), "first\n");
    }

    #[test]
    fn reopen_follows_an_external_rename() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut files = AppFiles::new(dir.path(), policy(1 << 20, 2, false)).expect("files");
        files.append("shop", b"before\n").expect("append");
        let app = dir.path().join("shop");
        std::fs::rename(app.join("access.log"), app.join("moved.log")).expect("logrotate");
        files.reopen_all().expect("reopen");
        files.append("shop", b"after\n").expect("append");
        assert_eq!(read(app.join("moved.log")), "before\n");
        assert_eq!(read(app.join("access.log")), "after\n");
    }
}
