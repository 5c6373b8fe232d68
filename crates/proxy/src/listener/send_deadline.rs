//! A deadline for each write to a client (`--client-send-timeout-s`, nginx's `send_timeout`).
//! Unbounded, a write waits as long as a client that stops reading likes, holding the
//! answer's buffers and the backend connection it is read from; here a write that makes no
//! progress for the deadline fails, and the connection is closed (by the HTTP/1 driver, or
//! by hyper's HTTP/2 server).

use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `inner`, whose writes fail once one has waited `after` without progress.
pub(super) struct SendDeadline<S> {
    inner: S,
    after: Duration,
    /// Armed while a write waits; dropped once one goes through.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<S> SendDeadline<S> {
    pub(super) fn new(inner: S, after: Duration) -> Self {
        Self {
            inner,
            after,
            sleep: None,
        }
    }

    pub(super) fn into_inner(self) -> S {
        self.inner
    }

    /// After `poll` of a write: progress disarms the deadline, a wait arms it, and a wait
    /// past it becomes an error.
    fn watch<T>(
        &mut self,
        poll: Poll<std::io::Result<T>>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<T>> {
        if poll.is_ready() {
            self.sleep = None;
            return poll;
        }
        let after = self.after;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(after)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the client read nothing for {after:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for SendDeadline<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for SendDeadline<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.watch(poll, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.watch(poll, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_flush(cx);
        this.watch(poll, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.watch(poll, cx)
    }
}
