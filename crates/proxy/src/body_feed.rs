//! A copy of a request's body handed, as it arrives, to a task of its own (the mirror's
//! copy to a shadow backend): the body on its way pushes each piece here and never waits.

use bytes::Bytes;
use tokio::sync::mpsc;

/// The request path's end of a copy in progress: body chunks are pushed here as they
/// arrive from the client.
#[derive(Debug)]
pub(crate) struct BodyFeed {
    sender: mpsc::UnboundedSender<BodyEvent>,
    limit: u64,
    /// Body bytes handed to the copy so far.
    forwarded: u64,
}

#[derive(Debug)]
pub(crate) enum BodyEvent {
    Data(Bytes),
    End,
    OverLimit,
}

impl BodyFeed {
    /// A feed that stops at `limit` bytes, and the copy's end of it: unbounded in count
    /// but not in bytes.
    pub(crate) fn new(limit: u64) -> (Self, mpsc::UnboundedReceiver<BodyEvent>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let feed = Self {
            sender,
            limit,
            forwarded: 0,
        };
        (feed, receiver)
    }

    /// Hands a piece of the client's body to the copy. Never waits. False once the copy
    /// needs nothing more (the body ended, passed the limit, or the copy is over).
    pub(crate) fn push(&mut self, chunk: Option<&Bytes>, end_of_stream: bool) -> bool {
        let mut keep = true;
        if let Some(chunk) = chunk.filter(|c| !c.is_empty()) {
            self.forwarded += chunk.len() as u64;
            keep = if self.forwarded > self.limit {
                let _ = self.sender.send(BodyEvent::OverLimit);
                false
            } else {
                // An error means the copy already ended (e.g. the shadow was unreachable).
                self.sender.send(BodyEvent::Data(chunk.clone())).is_ok()
            };
        }
        if keep && end_of_stream {
            let _ = self.sender.send(BodyEvent::End);
            keep = false;
        }
        keep
    }
}
