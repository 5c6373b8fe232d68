//! Ending a WebSocket the router closes with a close frame (1001, going away) instead of a
//! bare TCP close, which clients report as an abnormal closure (1006) and may treat as a
//! network fault.
//!
//! The router only relays the backend's bytes, so a frame of its own may go in only between
//! two of the backend's frames: [`FrameBoundary`] follows the frame headers of the
//! backend-to-client stream (lengths only, payloads are not looked at) to know where one
//! ends. A close frame is a control frame, which RFC 6455 (5.4) allows between the fragments
//! of a message.

use bytes::{BufMut, Bytes, BytesMut};

/// Status 1001: the endpoint is going away.
const GOING_AWAY: u16 = 1001;
/// Sent with the status, for people reading a client's log.
const REASON: &[u8] = b"backend connection closed by the router";

/// Where the backend-to-client byte stream stands relative to WebSocket frames.
#[derive(Debug, Default)]
pub(crate) struct FrameBoundary {
    /// Bytes of a frame header read so far (at most 14: 2, 8 of length, 4 of mask).
    header: [u8; 14],
    header_len: usize,
    /// Payload bytes of the current frame still to come.
    payload_left: u64,
    /// The stream no longer parses as frames: the router adds nothing to it.
    lost: bool,
}

impl FrameBoundary {
    /// Follows `bytes`, the next piece of the stream.
    pub(crate) fn advance(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && !self.lost {
            if self.payload_left > 0 {
                let skipped = usize::try_from(self.payload_left)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                self.payload_left -= skipped as u64;
                bytes = &bytes[skipped..];
                continue;
            }
            let needed = self.header_needed();
            let taken = (needed - self.header_len).min(bytes.len());
            self.header[self.header_len..self.header_len + taken].copy_from_slice(&bytes[..taken]);
            self.header_len += taken;
            bytes = &bytes[taken..];
            // The length field may have just become readable and asked for more header.
            if self.header_len == self.header_needed() {
                self.payload_left = self.payload_length();
                self.header_len = 0;
            }
        }
    }

    /// Whether the stream so far ends exactly at the end of a frame.
    pub(crate) fn at_boundary(&self) -> bool {
        !self.lost && self.header_len == 0 && self.payload_left == 0
    }

    /// Header length implied by the bytes seen: 2 until the second byte is known.
    fn header_needed(&self) -> usize {
        if self.header_len < 2 {
            return 2;
        }
        let length_field = match self.header[1] & 0x7f {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        let mask = if self.header[1] & 0x80 != 0 { 4 } else { 0 };
        2 + length_field + mask
    }

    fn payload_length(&mut self) -> u64 {
        match self.header[1] & 0x7f {
            126 => u64::from(u16::from_be_bytes([self.header[2], self.header[3]])),
            127 => {
                let mut length = [0u8; 8];
                length.copy_from_slice(&self.header[2..10]);
                let length = u64::from_be_bytes(length);
                // The most significant bit must be 0 (RFC 6455 5.2).
                if length >> 63 != 0 {
                    self.lost = true;
                }
                length
            }
            short => u64::from(short),
        }
    }
}

/// The close frame a server sends: unmasked, status 1001 and a short reason.
pub(crate) fn going_away_frame() -> Bytes {
    let mut frame = BytesMut::with_capacity(4 + REASON.len());
    frame.put_u8(0x88); // FIN + opcode close
    frame.put_u8((2 + REASON.len()) as u8);
    frame.put_u16(GOING_AWAY);
    frame.put_slice(REASON);
    frame.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(payload_len: usize, masked: bool) -> Vec<u8> {
        let mut frame = vec![0x82];
        let mask_bit = if masked { 0x80 } else { 0 };
        match payload_len {
            0..=125 => frame.push(mask_bit | payload_len as u8),
            126..=65535 => {
                frame.push(mask_bit | 126);
                frame.extend_from_slice(&(payload_len as u16).to_be_bytes());
            }
            _ => {
                frame.push(mask_bit | 127);
                frame.extend_from_slice(&(payload_len as u64).to_be_bytes());
            }
        }
        if masked {
            frame.extend_from_slice(&[1, 2, 3, 4]);
        }
        frame.extend(std::iter::repeat_n(7u8, payload_len));
        frame
    }

    #[test]
    fn boundaries_are_found_whatever_the_pieces() {
        let mut stream = Vec::new();
        let mut ends = Vec::new();
        for (length, masked) in [
            (0, false),
            (5, false),
            (125, true),
            (126, false),
            (70_000, true),
        ] {
            stream.extend(frame(length, masked));
            ends.push(stream.len());
        }
        for piece in [1, 2, 3, 7, 100, 4096, stream.len()] {
            let mut boundary = FrameBoundary::default();
            let mut seen = 0;
            for chunk in stream.chunks(piece) {
                boundary.advance(chunk);
                seen += chunk.len();
                assert_eq!(
                    boundary.at_boundary(),
                    ends.contains(&seen),
                    "pieces of {piece}, after {seen} bytes"
                );
            }
        }
    }

    #[test]
    fn an_impossible_length_stops_the_tracking() {
        let mut boundary = FrameBoundary::default();
        boundary.advance(&[0x82, 127, 0x80, 0, 0, 0, 0, 0, 0, 0]);
        assert!(!boundary.at_boundary());
        boundary.advance(&frame(3, false));
        assert!(
            !boundary.at_boundary(),
            "nothing is added to a stream we lost"
        );
    }

    #[test]
    fn the_close_frame_says_going_away() {
        let frame = going_away_frame();
        let mut boundary = FrameBoundary::default();
        boundary.advance(&frame);
        assert!(boundary.at_boundary(), "one whole frame");
        assert_eq!(&frame[..4], &[0x88, 2 + REASON.len() as u8, 0x03, 0xE9]);
    }
}
