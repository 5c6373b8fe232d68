//! The logging phase: what the log needs of a request, kept until its answer is done.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use http::{Method, Uri, Version};
use switchyard_h1::AnswerFields;

use super::client::Client;
use crate::access_log::Exchange;
use crate::context::RequestCtx;
use crate::event_loop::EventLoop;

/// What the log needs of a request, kept until its answer is done (or, for a WebSocket,
/// until the relay ends); recorded when dropped, so a request whose client left midway is
/// logged too.
pub(crate) struct RequestEnd {
    pub(crate) worker: Rc<EventLoop>,
    pub(crate) ctx: RequestCtx,
    pub(crate) method: Method,
    pub(crate) target: Uri,
    pub(crate) version: Version,
    /// The client's connection.
    pub(crate) connection: Rc<Client>,
    pub(crate) bytes_in: Rc<Cell<usize>>,
    /// The status sent, 0 until one is.
    pub(crate) status: u16,
    pub(crate) bytes_out: usize,
    /// The backend's answer's fields as read, for an HTTP/1.x client's head, when the
    /// answer was not made into a map (`AnswerForm::AsRead`).
    pub(crate) answer_fields: Option<AnswerFields>,
}

impl Drop for RequestEnd {
    fn drop(&mut self) {
        let (ctx, status) = (&self.ctx, self.status);
        ctx.count_answer(status);
        if let Some(app) = &ctx.charged {
            let cost = &app.cost;
            let bytes_in = self.bytes_in.get() as u64;
            cost.client_bytes_in.fetch_add(bytes_in, Ordering::Relaxed);
            cost.client_bytes_out
                .fetch_add(self.bytes_out as u64, Ordering::Relaxed);
        }
        self.worker.shared.access_log.record(
            &Exchange {
                method: &self.method,
                target: &self.target,
                version: self.version,
                bytes_in: self.bytes_in.get(),
                bytes_out: self.bytes_out,
                client: Some(self.connection.ip()),
            },
            ctx,
            status,
        );
        self.ctx.release_attempt();
    }
}
