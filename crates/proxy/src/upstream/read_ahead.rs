//! Answers read ahead of a slow client (nginx's `proxy_buffering`): the backend's body is
//! read at the backend's speed into memory, then into an unlinked spool file, and its
//! connection goes back to the pool while the client drains what was read — so an app's
//! workers (Puma, Unicorn, gunicorn: one request each) are never held by a slow phone.
//!
//! Bounded three ways, each with its gauge: what one answer may hold ahead of its client
//! (`--response-buffer-mb`), the memory all answers hold (`--response-buffer-memory-mb`),
//! the disk they spool (`--response-spool-mb`). When the answer's share or both budgets
//! are full, reading waits for the client (the answer streams at its pace, as without
//! buffering) and `switchyard_response_buffer_full_total` counts it.
//!
//! Only answers whose body is not in hand with their head are read ahead: smaller ones go
//! whole into hyper's write queue (about 400 KiB) at once anyway.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::Body;

use super::backend_h1::BackendBody;
use super::response_buffers::ResponseBuffers;
use crate::body_read::BodyError;
use crate::event_loop::EventLoop;
use crate::metrics;

/// Most of one answer held in memory; the rest of its share goes to the spool.
const MEMORY_PER_ANSWER: u64 = 1 << 20;

/// A piece of the answer read ahead, in order.
enum Piece {
    Memory(Bytes),
    /// So many bytes at the spool's read offset.
    Spooled(usize),
}

/// What the reading task and the client's body share.
struct Queue {
    pieces: VecDeque<Piece>,
    in_memory: u64,
    /// Bytes held, in memory and spooled, not yet handed to the client.
    held: u64,
    spool: Option<Spool>,
    /// How the backend's body ended, once it has.
    end: Option<Result<(), BodyError>>,
    /// The client's body waits for a piece.
    reader: Option<Waker>,
    /// The reading task waits for room.
    writer: Option<Waker>,
    /// The client left: the reading task stops, and the backend's connection closes.
    reader_gone: bool,
    /// Whether the answer's share or a budget ran out while it was read (counted once).
    was_full: bool,
}

struct Spool {
    file: File,
    written: u64,
    read: u64,
}

impl Queue {
    fn wake_reader(&mut self) {
        if let Some(waker) = self.reader.take() {
            waker.wake();
        }
    }

    fn wake_writer(&mut self) {
        if let Some(waker) = self.writer.take() {
            waker.wake();
        }
    }
}

/// The client's end of an answer read ahead.
pub(crate) struct ReadAhead {
    queue: Rc<RefCell<Queue>>,
    buffers: Arc<ResponseBuffers>,
}

impl ReadAhead {
    /// Starts reading `body` ahead of the client, each piece within `read_deadline`; its
    /// connection goes back to `worker`'s pool once the body is read to its end.
    pub(crate) fn start(
        body: BackendBody,
        read_deadline: Duration,
        worker: Rc<EventLoop>,
        buffers: Arc<ResponseBuffers>,
    ) -> Self {
        metrics::RESPONSES_READ_AHEAD.inc();
        let queue = Rc::new(RefCell::new(Queue {
            pieces: VecDeque::new(),
            in_memory: 0,
            held: 0,
            spool: None,
            end: None,
            reader: None,
            writer: None,
            reader_gone: false,
            was_full: false,
        }));
        tokio::task::spawn_local(fill(
            body,
            read_deadline,
            queue.clone(),
            buffers.clone(),
            worker,
        ));
        Self { queue, buffers }
    }

    /// The next piece for the client, in order; `None` at the end.
    pub(crate) fn poll_piece(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, BodyError>>> {
        let mut queue = self.queue.borrow_mut();
        let Some(piece) = queue.pieces.pop_front() else {
            return match &queue.end {
                Some(Ok(())) => Poll::Ready(None),
                Some(Err(_)) => match queue.end.take() {
                    Some(Err(e)) => Poll::Ready(Some(Err(e))),
                    _ => Poll::Ready(None),
                },
                None => {
                    queue.reader = Some(cx.waker().clone());
                    Poll::Pending
                }
            };
        };
        let bytes = match piece {
            Piece::Memory(bytes) => {
                queue.in_memory -= bytes.len() as u64;
                self.buffers.memory.release(bytes.len() as u64);
                bytes
            }
            Piece::Spooled(length) => {
                let Some(spool) = queue.spool.as_mut() else {
                    return Poll::Ready(Some(Err(spool_lost())));
                };
                // A read from the page cache, on the loop as nginx's is (no `aio threads`).
                let mut bytes = BytesMut::zeroed(length);
                if let Err(e) = spool.file.read_exact_at(&mut bytes, spool.read) {
                    return Poll::Ready(Some(Err(BodyError::File(e))));
                }
                spool.read += length as u64;
                if spool.read == spool.written {
                    // All read: the file starts again from nothing, so an answer larger
                    // than its share never grows it past the share.
                    self.buffers.spool.release(spool.written);
                    let _ = spool.file.set_len(0);
                    (spool.read, spool.written) = (0, 0);
                }
                bytes.freeze()
            }
        };
        queue.held -= bytes.len() as u64;
        queue.wake_writer();
        Poll::Ready(Some(Ok(bytes)))
    }

    pub(crate) fn is_end_stream(&self) -> bool {
        let queue = self.queue.borrow();
        queue.pieces.is_empty() && matches!(queue.end, Some(Ok(())))
    }
}

fn spool_lost() -> BodyError {
    BodyError::File(std::io::Error::other("the response spool is gone"))
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        let mut queue = self.queue.borrow_mut();
        queue.reader_gone = true;
        for piece in queue.pieces.drain(..) {
            if let Piece::Memory(bytes) = piece {
                self.buffers.memory.release(bytes.len() as u64);
            }
        }
        queue.in_memory = 0;
        queue.held = 0;
        if let Some(spool) = queue.spool.take() {
            self.buffers.spool.release(spool.written);
        }
        queue.wake_writer();
    }
}

/// Reads `body` into `queue` while there is room, until its end.
async fn fill(
    mut body: BackendBody,
    read_deadline: Duration,
    queue: Rc<RefCell<Queue>>,
    buffers: Arc<ResponseBuffers>,
    worker: Rc<EventLoop>,
) {
    loop {
        let room = std::future::poll_fn(|cx| {
            let mut queue = queue.borrow_mut();
            if queue.reader_gone {
                return Poll::Ready(false);
            }
            if queue.held < buffers.per_answer {
                return Poll::Ready(true);
            }
            queue.writer = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
        if !room {
            return;
        }
        let next = tokio::time::timeout(
            read_deadline,
            std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)),
        )
        .await;
        let data = match next {
            Ok(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => data,
                Err(_) => continue,
            },
            Ok(None) => {
                let mut queue = queue.borrow_mut();
                queue.end = Some(Ok(()));
                queue.wake_reader();
                drop(queue);
                if let Some(connection) = body.take_reusable() {
                    worker.pool.put(connection);
                }
                return;
            }
            Ok(Some(Err(e))) => {
                end_with(&queue, BodyError::Backend(e));
                return;
            }
            Err(_) => {
                end_with(&queue, BodyError::TimedOut(read_deadline));
                return;
            }
        };
        if !hold(&queue, &buffers, data).await {
            return;
        }
    }
}

fn end_with(queue: &RefCell<Queue>, error: BodyError) {
    let mut queue = queue.borrow_mut();
    queue.end = Some(Err(error));
    queue.wake_reader();
}

/// Puts `data` in the queue: in memory while the answer's memory share and the memory
/// budget allow, else in the spool while its budget allows, else once the client has
/// taken enough for one of them to. False when the client left meanwhile.
async fn hold(queue: &RefCell<Queue>, buffers: &ResponseBuffers, data: Bytes) -> bool {
    let length = data.len() as u64;
    let mut data = Some(data);
    std::future::poll_fn(|cx| {
        let mut queue = queue.borrow_mut();
        if queue.reader_gone {
            return Poll::Ready(false);
        }
        let Some(piece) = data.take() else {
            return Poll::Ready(false);
        };
        // Nothing held: the client takes this piece next, whatever the budgets say.
        let in_memory = if queue.held == 0 {
            buffers.memory.reserve_past_limit(length);
            true
        } else {
            queue.in_memory + length <= MEMORY_PER_ANSWER && buffers.memory.reserve(length)
        };
        if in_memory {
            queue.in_memory += length;
            queue.held += length;
            queue.pieces.push_back(Piece::Memory(piece));
            queue.wake_reader();
            return Poll::Ready(true);
        }
        // The spool's budget counts what its files hold, read or not: a file is emptied
        // only once its client has read all of it.
        let file_room = queue
            .spool
            .as_ref()
            .is_none_or(|spool| spool.written + length <= buffers.per_answer);
        if file_room && buffers.spool.reserve(length) {
            match spool_piece(&mut queue, buffers, &piece) {
                Ok(()) => {
                    queue.held += length;
                    queue.pieces.push_back(Piece::Spooled(piece.len()));
                    queue.wake_reader();
                    return Poll::Ready(true);
                }
                Err(e) => {
                    buffers.spool.release(length);
                    log::warn!("response spool in {}: {e}", buffers.spool_dir.display());
                }
            }
        }
        if !queue.was_full {
            queue.was_full = true;
            metrics::RESPONSE_BUFFER_FULL.inc();
        }
        data = Some(piece);
        queue.writer = Some(cx.waker().clone());
        Poll::Pending
    })
    .await
}

/// Appends `piece` to the answer's spool file, made (unlinked) on its first piece. A write
/// to the page cache, on the loop, as nginx's temp files are written.
fn spool_piece(queue: &mut Queue, buffers: &ResponseBuffers, piece: &[u8]) -> std::io::Result<()> {
    if queue.spool.is_none() {
        queue.spool = Some(Spool {
            file: tempfile::tempfile_in(&buffers.spool_dir)?,
            written: 0,
            read: 0,
        });
    }
    let Some(spool) = queue.spool.as_mut() else {
        return Err(std::io::Error::other("no spool"));
    };
    spool.file.write_all_at(piece, spool.written)?;
    spool.written += piece.len() as u64;
    Ok(())
}
