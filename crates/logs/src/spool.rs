//! The router's bounded on-disk queue of batches, used while the log services are slow or
//! away: segment files of frames in send order, read back in that order and deleted once
//! every frame read from them has been acknowledged. A router restart reads the remaining
//! segments from their start again (what was acknowledged before is recognised by `logd`).

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::frame::{self, Frame, FrameError};

/// A segment is closed for appends past this size, so acknowledged data is freed in steps.
const SEGMENT_BYTES: u64 = 4 * 1024 * 1024;
/// Segments created by a running router start here, leaving room below for segments put in
/// front of the queue (at shutdown, for batches that were only in memory).
const FIRST_SEGMENT: u64 = 1 << 40;
const SUFFIX: &str = ".spool";
/// Held (flock) by the router using a spool directory, for as long as it runs.
const LOCK_FILE: &str = ".lock";
/// While another router holds a spool directory (the one this router replaces in a binary
/// upgrade is still draining), this router spools in `DIR/handover-PID` instead; a later
/// router owning `DIR` takes those segments over once their writer is gone.
const HANDOVER_PREFIX: &str = "handover-";

struct Segment {
    number: u64,
    bytes: u64,
    /// Where the next read starts.
    read_offset: u64,
    /// Frames read from it and not yet acknowledged.
    in_flight: usize,
}

/// Where a spooled frame came from, to acknowledge it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SpoolPosition {
    segment: u64,
}

/// The on-disk queue. Not thread-safe by itself: the outbox holds it under its lock.
pub(crate) struct Spool {
    dir: PathBuf,
    limit_bytes: u64,
    segments: VecDeque<Segment>,
    bytes: u64,
    /// Append handle to the last segment, while it takes appends.
    appending: Option<File>,
    /// Read handle and the segment it reads.
    reading: Option<(u64, BufReader<File>)>,
    /// The directory's lock, held until this spool is dropped.
    _lock: File,
}

impl Spool {
    /// Opens the spool in `dir` (created if missing), keeping what an earlier run left. If
    /// another live router holds `dir`, a hand-over directory inside it is used instead.
    pub(crate) fn open(dir: &Path, limit_bytes: u64) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        if let Some(lock) = try_lock(dir)? {
            adopt_handovers(dir)?;
            return Self::open_locked(dir, lock, limit_bytes);
        }
        let own = dir.join(format!("{HANDOVER_PREFIX}{}", std::process::id()));
        std::fs::create_dir_all(&own)?;
        let lock = try_lock(&own)?.ok_or_else(|| {
            io::Error::other(format!("{} is locked by another process", own.display()))
        })?;
        log::info!(
            "log spool {} is held by the router this one replaces; spooling in {}",
            dir.display(),
            own.display()
        );
        Self::open_locked(&own, lock, limit_bytes)
    }

    fn open_locked(dir: &Path, lock: File, limit_bytes: u64) -> io::Result<Self> {
        let mut segments: Vec<Segment> = segment_files(dir)?
            .into_iter()
            .map(|(number, bytes)| Segment {
                number,
                bytes,
                read_offset: 0,
                in_flight: 0,
            })
            .collect();
        segments.sort_by_key(|s| s.number);
        let bytes = segments.iter().map(|s| s.bytes).sum();
        Ok(Self {
            dir: dir.to_path_buf(),
            limit_bytes,
            segments: segments.into(),
            bytes,
            appending: None,
            reading: None,
            _lock: lock,
        })
    }

    /// Bytes on disk.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether frames wait to be read.
    pub(crate) fn has_unread(&self) -> bool {
        self.segments.iter().any(|s| s.read_offset < s.bytes)
    }

    /// Appends a frame; `Ok(false)` when the spool is full (the caller drops it).
    pub(crate) fn append(&mut self, frame: &Frame) -> io::Result<bool> {
        let size = frame.bytes.len() as u64;
        if self.bytes + size > self.limit_bytes {
            return Ok(false);
        }
        let needs_new = match self.segments.back() {
            Some(last) => self.appending.is_none() || last.bytes + size > SEGMENT_BYTES,
            None => true,
        };
        if needs_new {
            let number = self
                .segments
                .back()
                .map_or(FIRST_SEGMENT, |s| s.number.max(FIRST_SEGMENT) + 1);
            self.appending = Some(self.create(number)?);
            self.segments.push_back(Segment {
                number,
                bytes: 0,
                read_offset: 0,
                in_flight: 0,
            });
        }
        let (Some(file), Some(last)) = (self.appending.as_mut(), self.segments.back_mut()) else {
            return Err(io::Error::other("spool segment vanished"));
        };
        if let Err(e) = file.write_all(&frame.bytes) {
            // A partial frame would be misread later: cut the segment back and stop using it.
            let _ = file.set_len(last.bytes);
            self.appending = None;
            return Err(e);
        }
        last.bytes += size;
        self.bytes += size;
        Ok(true)
    }

    /// Puts `frames` in front of everything spooled (in their order), in a segment of its
    /// own; used at shutdown for batches that were only in memory. All or nothing.
    pub(crate) fn prepend(&mut self, frames: &[Frame]) -> io::Result<bool> {
        let size: u64 = frames.iter().map(|f| f.bytes.len() as u64).sum();
        if frames.is_empty() {
            return Ok(true);
        }
        if self.bytes + size > self.limit_bytes {
            return Ok(false);
        }
        let number = self.segments.front().map_or(FIRST_SEGMENT, |s| s.number) - 1;
        let mut file = self.create(number)?;
        for frame in frames {
            file.write_all(&frame.bytes)?;
        }
        file.sync_all()?;
        self.segments.push_front(Segment {
            number,
            bytes: size,
            read_offset: 0,
            in_flight: 0,
        });
        self.bytes += size;
        Ok(true)
    }

    /// The next unread frame. A damaged or cut frame (a crash mid-append) ends its segment:
    /// what follows it cannot be framed, and is counted by the caller as dropped.
    pub(crate) fn next(&mut self) -> Option<(Frame, SpoolPosition)> {
        loop {
            let index = self.segments.iter().position(|s| s.read_offset < s.bytes)?;
            let number = self.segments[index].number;
            if self.reading.as_ref().map(|(n, _)| *n) != Some(number) {
                let opened = File::open(self.path(number)).and_then(|mut file| {
                    file.seek(SeekFrom::Start(self.segments[index].read_offset))?;
                    Ok(file)
                });
                match opened {
                    Ok(file) => self.reading = Some((number, BufReader::new(file))),
                    Err(e) => {
                        log::error!("cannot read log spool segment {number}: {e}; skipping it");
                        self.skip_rest(index);
                        continue;
                    }
                }
            }
            let (_, reader) = self.reading.as_mut()?;
            match frame::read_batch(reader) {
                Ok(Some((id, payload))) => {
                    let bytes = frame::encode_batch(id, &payload);
                    let segment = &mut self.segments[index];
                    segment.read_offset += bytes.len() as u64;
                    segment.in_flight += 1;
                    let lines = frame::count_lines(&payload);
                    return Some((
                        Frame { id, bytes, lines },
                        SpoolPosition { segment: number },
                    ));
                }
                Ok(None) | Err(FrameError::Io(_)) | Err(FrameError::Malformed(_)) => {
                    log::error!(
                        "log spool segment {number} is damaged at byte {}; skipping its rest",
                        self.segments[index].read_offset
                    );
                    crate::metrics::SPOOL_DAMAGED.inc();
                    self.skip_rest(index);
                }
            }
        }
    }

    /// A frame read from `position` was acknowledged (or refused for good).
    pub(crate) fn acknowledge(&mut self, position: SpoolPosition) {
        if let Some(segment) = self
            .segments
            .iter_mut()
            .find(|s| s.number == position.segment)
        {
            segment.in_flight = segment.in_flight.saturating_sub(1);
        }
        self.delete_finished();
    }

    fn skip_rest(&mut self, index: usize) {
        let segment = &mut self.segments[index];
        segment.read_offset = segment.bytes;
        self.reading = None;
        self.delete_finished();
    }

    /// Deletes leading segments that are read to their end and fully acknowledged (the one
    /// taking appends too: the next append starts a new one), so an outage's spool is gone
    /// from disk once its backlog is delivered.
    fn delete_finished(&mut self) {
        while let Some(first) = self.segments.front() {
            if first.read_offset < first.bytes || first.in_flight > 0 {
                return;
            }
            let (number, bytes) = (first.number, first.bytes);
            if self.segments.len() == 1 {
                self.appending = None;
            }
            if self.reading.as_ref().is_some_and(|(n, _)| *n == number) {
                self.reading = None;
            }
            if let Err(e) = std::fs::remove_file(self.path(number)) {
                log::warn!("cannot delete log spool segment {number}: {e}");
            }
            self.bytes -= bytes;
            self.segments.pop_front();
        }
    }

    fn create(&self, number: u64) -> io::Result<File> {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(number))
    }

    fn path(&self, number: u64) -> PathBuf {
        self.dir.join(format!("{number:020}{SUFFIX}"))
    }
}

/// The directory's lock file, locked; `None` while another process holds it.
fn try_lock(dir: &Path) -> io::Result<Option<File>> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(LOCK_FILE))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// Segment numbers and sizes in `dir`.
fn segment_files(dir: &Path) -> io::Result<Vec<(u64, u64)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(number) = name
            .to_str()
            .and_then(|n| n.strip_suffix(SUFFIX))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        found.push((number, entry.metadata()?.len()));
    }
    found.sort_unstable();
    Ok(found)
}

/// Moves the segments of hand-over directories whose router has exited behind the
/// segments of `dir` (their order kept; batches carry their sender, so logd tells the
/// routers apart), then removes those directories.
fn adopt_handovers(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let is_handover = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(HANDOVER_PREFIX));
        if !is_handover || !entry.file_type()?.is_dir() {
            continue;
        }
        let handover = entry.path();
        // Still held: its router is running and will finish with it.
        let Some(_lock) = try_lock(&handover)? else {
            continue;
        };
        let first_free = segment_files(dir)?
            .last()
            .map_or(FIRST_SEGMENT, |(n, _)| n.max(&FIRST_SEGMENT) + 1);
        for (new_number, (number, _)) in (first_free..).zip(segment_files(&handover)?) {
            std::fs::rename(
                handover.join(format!("{number:020}{SUFFIX}")),
                dir.join(format!("{new_number:020}{SUFFIX}")),
            )?;
        }
        std::fs::remove_dir_all(&handover)?;
        log::info!("log spool: took over {}", handover.display());
    }
    Ok(())
}

/// Frames of a batch id, for tests across modules.
#[cfg(test)]
pub(crate) fn test_frame(seq: u64, app: &str, line: &str) -> Frame {
    let mut builder = crate::frame::BatchBuilder::default();
    builder.push(app, line.as_bytes());
    builder.finish(crate::frame::BatchId { sender: 1, seq })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(spool: &mut Spool) -> Vec<u64> {
        let mut seqs = Vec::new();
        while let Some((frame, position)) = spool.next() {
            seqs.push(frame.id.seq);
            spool.acknowledge(position);
        }
        seqs
    }

    #[test]
    fn frames_come_back_in_order_across_segments_and_restarts_and_the_files_go() {
        let dir = tempfile::tempdir().expect("temp dir");
        let big_line = "x".repeat(60_000);
        {
            let mut spool = Spool::open(dir.path(), 1 << 30).expect("open");
            for seq in 1..=100 {
                assert!(spool
                    .append(&test_frame(seq, "shop", &big_line))
                    .expect("append"));
            }
            assert!(spool.segments.len() > 1, "several segments");
            let (first, position) = spool.next().expect("a frame");
            assert_eq!(first.id.seq, 1);
            spool.acknowledge(position);
        }
        // A restart: everything not deleted is read again, in order.
        let mut spool = Spool::open(dir.path(), 1 << 30).expect("reopen");
        assert!(spool
            .prepend(&[test_frame(0, "shop", "early")])
            .expect("prepend"));
        let seqs = drain(&mut spool);
        assert_eq!(seqs, (0..=100).collect::<Vec<_>>());
        assert_eq!(spool.bytes(), 0);
        assert!(
            segment_files(dir.path()).expect("list").is_empty(),
            "delivered segments are deleted"
        );
    }

    #[test]
    fn a_router_starting_beside_a_running_one_spools_apart_and_the_next_start_takes_it_over() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut old = Spool::open(dir.path(), 1 << 30).expect("open");
        let mut new = Spool::open(dir.path(), 1 << 30).expect("open beside");
        assert_ne!(new.dir, old.dir, "the held directory is not shared");
        assert!(old.append(&test_frame(1, "shop", "old")).expect("append"));
        assert!(new.append(&test_frame(2, "shop", "new")).expect("append"));
        // The new router is still running: a restart of the old one does not take its files.
        drop(old);
        let mut again = Spool::open(dir.path(), 1 << 30).expect("reopen");
        assert_eq!(drain(&mut again), vec![1]);
        drop(again);
        assert!(new.append(&test_frame(3, "shop", "new")).expect("append"));
        drop(new);
        let mut next = Spool::open(dir.path(), 1 << 30).expect("next start");
        assert_eq!(
            drain(&mut next),
            vec![2, 3],
            "what the hand-over spooled is delivered"
        );
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .flatten()
            .filter(|e| e.path().is_dir())
            .collect();
        assert!(leftovers.is_empty(), "the hand-over directory is removed");
    }

    #[test]
    fn a_full_spool_refuses_and_a_cut_frame_ends_its_segment() {
        let dir = tempfile::tempdir().expect("temp dir");
        let frame = test_frame(1, "shop", "line");
        let size = frame.bytes.len() as u64;
        let mut spool = Spool::open(dir.path(), size * 2).expect("open");
        assert!(spool.append(&frame).expect("first"));
        assert!(spool
            .append(&test_frame(2, "shop", "line"))
            .expect("second"));
        assert!(!spool.append(&test_frame(3, "shop", "line")).expect("full"));
        drop(spool);
        // Cut the second frame in half, as a crash mid-write would.
        let (number, _) = segment_files(dir.path()).expect("list")[0];
        let segment = dir.path().join(format!("{number:020}{SUFFIX}"));
        let file = OpenOptions::new().write(true).open(&segment).expect("open");
        file.set_len(size + size / 2).expect("truncate");
        let mut spool = Spool::open(dir.path(), size * 2).expect("reopen");
        assert_eq!(drain(&mut spool), vec![1]);
        assert!(!spool.has_unread());
    }
}
