//! A request body read whole by the router (`stage::request_buffer`), given to the stages
//! after it as the client's body would be: the WAF, the filters, the mirror's copy and the
//! backend read it once, piece by piece, from memory or from its spool file. What it holds
//! of the router's memory and spool budgets is given back when it is dropped (sent, or the
//! request gone).

use std::fs::File;
use std::future::Future as _;
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use tokio::task::JoinHandle;

use crate::byte_budget::BudgetHold;

/// Bytes read back from a spool file at a time (each read a hand-off to a blocking thread
/// and back, as each write is).
pub(crate) const SPOOL_PIECE: usize = 256 * 1024;

/// Where a buffered body is.
pub(crate) enum Stored {
    /// Whole in memory.
    Memory { data: Bytes, _held: BudgetHold },
    /// Whole in an unlinked spool file.
    Spool {
        file: Arc<File>,
        length: u64,
        _held: BudgetHold,
    },
}

/// A body read whole, handed on piece by piece.
pub(crate) struct BufferedBody {
    stored: Stored,
    /// How much of it has been handed on.
    sent: u64,
    length: u64,
    /// The read of the spool's next piece, off the event loop.
    reading: Option<JoinHandle<std::io::Result<Bytes>>>,
    trailers: Option<HeaderMap>,
}

impl BufferedBody {
    pub(crate) fn new(stored: Stored, trailers: Option<HeaderMap>) -> Self {
        let length = match &stored {
            Stored::Memory { data, .. } => data.len() as u64,
            Stored::Spool { length, .. } => *length,
        };
        Self {
            stored,
            sent: 0,
            length,
            reading: None,
            trailers,
        }
    }

    pub(crate) fn len(&self) -> u64 {
        self.length
    }

    pub(crate) fn spooled(&self) -> bool {
        matches!(self.stored, Stored::Spool { .. })
    }

    /// The whole body, when it is in memory and none of it was handed on yet: the WAF
    /// inspects it and holds it without a copy. The body is then at its end.
    pub(crate) fn take_in_memory(&mut self) -> Option<(Bytes, Option<HeaderMap>)> {
        match &self.stored {
            Stored::Memory { data, .. } if self.sent == 0 => {
                self.sent = self.length;
                Some((data.clone(), self.trailers.take()))
            }
            _ => None,
        }
    }

    /// Its spool file and length, when it was spooled and none of it was handed on yet.
    pub(crate) fn spool_file(&self) -> Option<(Arc<File>, u64)> {
        match &self.stored {
            Stored::Spool { file, length, .. } if self.sent == 0 => Some((file.clone(), *length)),
            _ => None,
        }
    }

    pub(crate) fn ended(&self) -> bool {
        self.sent >= self.length && self.trailers.is_none()
    }

    pub(crate) fn left(&self) -> u64 {
        self.length - self.sent
    }

    /// The next piece of data, then the trailers, then `None`.
    pub(crate) fn poll_piece(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::io::Result<PieceOrTrailers>>> {
        if self.sent >= self.length {
            return Poll::Ready(
                self.trailers
                    .take()
                    .map(|t| Ok(PieceOrTrailers::Trailers(t))),
            );
        }
        match &self.stored {
            Stored::Memory { data, .. } => {
                self.sent = self.length;
                Poll::Ready(Some(Ok(PieceOrTrailers::Piece(data.clone()))))
            }
            Stored::Spool { file, .. } => {
                let (offset, left) = (self.sent, self.length - self.sent);
                let reading = self.reading.get_or_insert_with(|| {
                    let file = file.clone();
                    let size = left.min(SPOOL_PIECE as u64) as usize;
                    tokio::task::spawn_blocking(move || {
                        let mut piece = vec![0; size];
                        file.read_exact_at(&mut piece, offset)?;
                        Ok(Bytes::from(piece))
                    })
                });
                let read = std::task::ready!(Pin::new(reading).poll(cx));
                self.reading = None;
                match read {
                    Ok(Ok(piece)) => {
                        self.sent += piece.len() as u64;
                        Poll::Ready(Some(Ok(PieceOrTrailers::Piece(piece))))
                    }
                    Ok(Err(e)) => {
                        self.sent = self.length;
                        Poll::Ready(Some(Err(e)))
                    }
                    Err(e) => {
                        self.sent = self.length;
                        Poll::Ready(Some(Err(std::io::Error::other(e))))
                    }
                }
            }
        }
    }
}

/// What a buffered body hands on next.
pub(crate) enum PieceOrTrailers {
    Piece(Bytes),
    Trailers(HeaderMap),
}
