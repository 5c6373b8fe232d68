//! Read buffers of connections gone idle, kept on their listener thread for the next
//! connection that reads. An idle connection, client's or backend's, holds no buffer (a
//! resident page each, measured), so each request took one and gave it back: two 16 KiB
//! allocations and frees a proxied request, 700 instructions of its 26k (callgrind,
//! bench/ENGINE.md). nginx keeps its freed buffers in the same way (its free list of large
//! header buffers), and so does HAProxy (its per-thread buffer pool).
//!
//! At most [`SPARE_BUFFERS`] a thread, each at most twice the room asked for (2 MiB of
//! 16 KiB reads): a buffer given back past that, or larger, is freed. Only a buffer nothing
//! else shares is kept (a request's head may still point into it).

use std::cell::RefCell;

use bytes::BytesMut;

use crate::metrics;

/// Most buffers a listener thread keeps: as many as requests it has in flight at once in
/// an ordinary moment, so a burst of new connections still allocates.
const SPARE_BUFFERS: usize = 64;

thread_local! {
    static SPARE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

/// A buffer with room for `room` bytes: a spare one when the thread has one.
pub(crate) fn take(room: usize) -> BytesMut {
    let spare = SPARE.with_borrow_mut(Vec::pop);
    match spare {
        Some(mut buffer) => {
            metrics::SPARE_READ_BUFFERS.dec();
            // Every buffer kept has at least `READ_PIECE` of room (`give_back`).
            buffer.reserve(room);
            buffer
        }
        None => BytesMut::with_capacity(room),
    }
}

/// Takes `buffer` from a connection going idle (leaving it none), and keeps it for the
/// next one when nothing else shares it and the thread keeps fewer than it may.
pub(crate) fn give_back(buffer: &mut BytesMut, room: usize) {
    let mut buffer = std::mem::take(buffer);
    // With `room` left already, `try_reclaim` would succeed without asking whether the
    // allocation is shared: such a buffer is freed, so that every one kept was reclaimed
    // whole — its only handle, no head pinned behind it.
    if !buffer.is_empty() || buffer.capacity() >= room {
        return;
    }
    // Fails (and the buffer is freed) when a request's head still shares the allocation.
    if !buffer.try_reclaim(room) || buffer.capacity() > 2 * room {
        return;
    }
    SPARE.with_borrow_mut(|spare| {
        if spare.len() < SPARE_BUFFERS {
            spare.push(buffer);
            metrics::SPARE_READ_BUFFERS.inc();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_taken_again_and_a_shared_one_is_not_kept() {
        let mut first = take(1024);
        first.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        let head = first.split_to(18).freeze();
        // Its head still points into it: not kept.
        give_back(&mut first, 1024);
        assert_eq!(first.capacity(), 0, "the connection keeps no buffer");
        assert!(SPARE.with_borrow(Vec::is_empty));
        drop(head);

        let mut second = take(1024);
        second.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        let pointer = second.as_ptr();
        let head = second.split_to(18).freeze();
        drop(head);
        give_back(&mut second, 1024);
        assert_eq!(SPARE.with_borrow(Vec::len), 1);
        let third = take(1024);
        assert_eq!(
            third.as_ptr(),
            pointer,
            "the same allocation, from its start"
        );
        assert!(third.capacity() >= 1024);
        assert!(SPARE.with_borrow(Vec::is_empty));
    }

    #[test]
    fn a_buffer_too_large_or_with_room_left_is_freed_not_kept() {
        let mut large = BytesMut::with_capacity(4096);
        large.extend_from_slice(&[b'x'; 4000]);
        drop(large.split_to(4000));
        give_back(&mut large, 1024);
        assert!(
            SPARE.with_borrow(Vec::is_empty),
            "past twice the room asked"
        );
        let mut roomy = BytesMut::with_capacity(1024);
        give_back(&mut roomy, 1024);
        assert!(
            SPARE.with_borrow(Vec::is_empty),
            "room left: shared or not, unknown"
        );
    }

    #[test]
    fn a_buffer_with_unread_bytes_is_never_kept() {
        let mut buffer = take(64);
        buffer.extend_from_slice(b"next request");
        give_back(&mut buffer, 64);
        assert!(SPARE.with_borrow(Vec::is_empty));
    }
}
