//! Batches between the router's access-log thread and its sender thread: a bounded memory
//! queue in front of the bounded on-disk spool, in one order. Once anything is spooled, new
//! batches are spooled behind it until the spool is read out, so delivery stays in order.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::frame::Frame;
use crate::metrics;
use crate::spool::{Spool, SpoolPosition};

/// A batch taken for sending, and where to acknowledge it.
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub(crate) frame: Frame,
    from_spool: Option<SpoolPosition>,
}

struct State {
    memory: VecDeque<Frame>,
    memory_bytes: usize,
    spool: Spool,
    /// After shutdown, everything goes to the spool.
    closed: bool,
}

pub(crate) struct Outbox {
    state: Mutex<State>,
    ready: Condvar,
    memory_limit: usize,
}

impl Outbox {
    pub(crate) fn new(spool: Spool, memory_limit: usize) -> Self {
        metrics::SHIP_SPOOL_BYTES.set(spool.bytes() as i64);
        Self {
            state: Mutex::new(State {
                memory: VecDeque::new(),
                memory_bytes: 0,
                spool,
                closed: false,
            }),
            ready: Condvar::new(),
            memory_limit,
        }
    }

    /// Queues a batch: in memory if there is room and nothing older is spooled, else on
    /// disk; when the spool is full too, its records are dropped and counted.
    pub(crate) fn push(&self, frame: Frame) {
        metrics::SHIP_BATCHES.inc();
        let mut state = self.state.lock();
        let fits = state.memory_bytes + frame.bytes.len() <= self.memory_limit;
        if !state.closed && fits && !state.spool.has_unread() {
            state.memory_bytes += frame.bytes.len();
            state.memory.push_back(frame);
        } else {
            spill(&mut state.spool, &frame);
        }
        publish(&state);
        drop(state);
        self.ready.notify_one();
    }

    /// The oldest batch, waiting up to `wait` for one.
    pub(crate) fn pop(&self, wait: Duration) -> Option<Outgoing> {
        let deadline = Instant::now() + wait;
        let mut state = self.state.lock();
        loop {
            if let Some(frame) = state.memory.pop_front() {
                state.memory_bytes -= frame.bytes.len();
                publish(&state);
                return Some(Outgoing {
                    frame,
                    from_spool: None,
                });
            }
            if let Some((frame, position)) = state.spool.next() {
                return Some(Outgoing {
                    frame,
                    from_spool: Some(position),
                });
            }
            if self.ready.wait_until(&mut state, deadline).timed_out() {
                return None;
            }
        }
    }

    /// A log service answered for `outgoing`: a spooled batch may now leave the disk.
    pub(crate) fn acknowledged(&self, outgoing: &Outgoing) {
        if let Some(position) = outgoing.from_spool {
            let mut state = self.state.lock();
            state.spool.acknowledge(position);
            publish(&state);
        }
    }

    /// Whether nothing waits to be sent.
    pub(crate) fn is_empty(&self) -> bool {
        let state = self.state.lock();
        state.memory.is_empty() && !state.spool.has_unread()
    }

    /// At shutdown: the batches sent but not acknowledged (`unacked`, oldest first) and those
    /// still in memory go in front of the spool, in that order, to be sent after a restart;
    /// later batches go to the spool directly.
    pub(crate) fn close(&self, unacked: Vec<Outgoing>) {
        let mut state = self.state.lock();
        state.closed = true;
        let mut frames: Vec<Frame> = unacked.into_iter().map(|o| o.frame).collect();
        frames.extend(state.memory.drain(..));
        state.memory_bytes = 0;
        let lines: u64 = frames.iter().map(|f| u64::from(f.lines)).sum();
        match state.spool.prepend(&frames) {
            Ok(true) => {
                if !frames.is_empty() {
                    log::info!(
                        "{} undelivered access-log batches kept in the spool for the next start",
                        frames.len()
                    );
                }
            }
            Ok(false) => {
                log::error!("the log spool is full: {lines} access-log records lost at shutdown");
                metrics::SHIP_DROPPED
                    .with_label_values(&["spool_full"])
                    .inc_by(lines);
            }
            Err(e) => {
                log::error!("cannot spool {lines} access-log records at shutdown: {e}");
                metrics::SHIP_DROPPED
                    .with_label_values(&["spool_error"])
                    .inc_by(lines);
            }
        }
        publish(&state);
    }
}

fn spill(spool: &mut Spool, frame: &Frame) {
    let dropped = match spool.append(frame) {
        Ok(true) => {
            metrics::SHIP_SPILLED.inc();
            return;
        }
        Ok(false) => "spool_full",
        Err(e) => {
            log::error!("cannot write to the log spool: {e}");
            "spool_error"
        }
    };
    metrics::SHIP_DROPPED
        .with_label_values(&[dropped])
        .inc_by(u64::from(frame.lines));
}

fn publish(state: &State) {
    metrics::SHIP_BUFFERED_BYTES.set(state.memory_bytes as i64);
    metrics::SHIP_SPOOL_BYTES.set(state.spool.bytes() as i64);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spool::test_frame;

    #[test]
    fn past_the_memory_limit_batches_spill_and_order_is_kept() {
        let dir = tempfile::tempdir().expect("temp dir");
        let one = test_frame(1, "shop", "line").bytes.len();
        let outbox = Outbox::new(Spool::open(dir.path(), 1 << 20).expect("spool"), one * 2);
        for seq in 1..=5 {
            outbox.push(test_frame(seq, "shop", "line"));
        }
        let first = outbox.pop(Duration::ZERO).expect("first");
        assert!(first.from_spool.is_none(), "the oldest were in memory");
        outbox.acknowledged(&first);
        // Memory has room again, but older batches are on disk: the new one goes behind them.
        outbox.push(test_frame(6, "shop", "line"));
        let mut order = vec![first.frame.id.seq];
        while let Some(next) = outbox.pop(Duration::ZERO) {
            order.push(next.frame.id.seq);
            outbox.acknowledged(&next);
        }
        assert_eq!(order, vec![1, 2, 3, 4, 5, 6]);
        assert!(outbox.is_empty());
    }

    #[test]
    fn close_keeps_unacknowledged_and_buffered_batches_for_the_next_start_in_order() {
        let dir = tempfile::tempdir().expect("temp dir");
        {
            let outbox = Outbox::new(Spool::open(dir.path(), 1 << 20).expect("spool"), 1 << 20);
            for seq in 1..=3 {
                outbox.push(test_frame(seq, "shop", "line"));
            }
            let sent = outbox
                .pop(Duration::ZERO)
                .expect("sent, never acknowledged");
            outbox.close(vec![sent]);
            outbox.push(test_frame(4, "shop", "after close"));
        }
        let outbox = Outbox::new(Spool::open(dir.path(), 1 << 20).expect("spool"), 1 << 20);
        let mut order = Vec::new();
        while let Some(next) = outbox.pop(Duration::ZERO) {
            order.push(next.frame.id.seq);
            outbox.acknowledged(&next);
        }
        assert_eq!(order, vec![1, 2, 3, 4]);
    }
}
