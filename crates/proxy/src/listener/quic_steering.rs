//! QUIC across `--upgrade`. TCP's listening sockets are handed to the router taking over
//! (`handover`); a UDP socket cannot be: QUIC's connection state lives in the process, so
//! the old router must go on reading its own connections' packets while the new one takes
//! the new connections. Both bind the port in one SO_REUSEPORT group, where the kernel
//! would spread packets by their addresses' hash: half of the old router's connections
//! would reach a process that knows nothing of them, and be reset.
//!
//! So, as QUIC-LB (draft-ietf-quic-load-balancers) routes by a server ID written in the
//! connection ID: every connection ID a router issues starts with its *generation*, two
//! bytes; the router taking over learns its predecessor's generation from the hand-over,
//! takes the next one, and attaches to the group a classic BPF program that sends a packet
//! whose destination connection ID starts with the predecessor's generation to the first
//! socket of the group (the predecessor's), and every other packet (its own connections',
//! and a new connection's first Initial, whose ID the client chose) to the second (its
//! own). Once the predecessor has exited, the group has one socket and the kernel's own
//! choice (for an index past the group's end) lands there.
//!
//! A client's first connection ID can start with the predecessor's generation by chance
//! (1 in 65,536): that connection goes to the old router, which takes it while it still
//! accepts, and otherwise the client tries again or uses TCP. An upgrade started while the
//! previous one still drains finds three sockets in the group; the middle one then gets
//! what this program sends to the second.

use std::time::Duration;

use nix::libc;
use nix::sys::socket::{setsockopt, sockopt::AttachReusePortCbpf};
use quinn::{ConnectionId, ConnectionIdGenerator};

/// Length of the connection IDs a router issues: quinn's default, of which the first two
/// bytes are the generation and the rest random.
const CID_LEN: usize = 8;

/// The first bytes of every connection ID a router issues, telling routers that share the
/// port (one taking over from another) apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CidGeneration(pub(super) u16);

impl CidGeneration {
    /// The generation of a router taking over from one of `predecessor`'s (none: the first).
    pub(super) fn after(predecessor: Option<CidGeneration>) -> Self {
        Self(predecessor.map_or(0, |p| p.0.wrapping_add(1)))
    }
}

/// Issues connection IDs that start with the router's generation.
pub(super) struct GenerationCids(pub(super) CidGeneration);

impl ConnectionIdGenerator for GenerationCids {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut bytes = [0u8; CID_LEN];
        bytes[..2].copy_from_slice(&self.0 .0.to_be_bytes());
        bytes[2..].copy_from_slice(&rand::random::<[u8; CID_LEN - 2]>());
        ConnectionId::new(&bytes)
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

// Classic BPF opcodes (linux/filter.h), for the one program below.
const LD_B_ABS: u16 = 0x30;
const LD_H_ABS: u16 = 0x28;
const JMP_JA: u16 = 0x05;
const JMP_JEQ_K: u16 = 0x15;
const JMP_JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;

/// The program that steers `predecessor`'s packets to the group's first socket and all
/// others to the second. It reads the UDP payload (the kernel skips the UDP header for
/// it): a long header's destination connection ID starts at byte 6 (after the first byte,
/// the version and the ID's length), a short header's at byte 1.
fn steering_program(predecessor: CidGeneration) -> [libc::sock_filter; 8] {
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    [
        op(LD_B_ABS, 0, 0, 0),
        // The header form bit: long (0) → 2, short → 4.
        op(JMP_JSET_K, 0, 2, 0x80),
        op(LD_H_ABS, 0, 0, 6),
        op(JMP_JA, 0, 0, 1),
        op(LD_H_ABS, 0, 0, 1),
        op(JMP_JEQ_K, 0, 1, u32::from(predecessor.0)),
        op(RET_K, 0, 0, 0),
        op(RET_K, 0, 0, 1),
    ]
}

/// Attaches the steering program to the SO_REUSEPORT group `socket` has joined (bound
/// beside the predecessor's socket, which is the group's first).
pub(super) fn steer_by_generation(
    socket: &socket2::Socket,
    predecessor: CidGeneration,
) -> std::io::Result<()> {
    let mut program = steering_program(predecessor);
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    setsockopt(socket, AttachReusePortCbpf, &fprog).map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the program the way the kernel does over `payload`: an index, or 0 when a load
    /// falls past the end (the kernel's answer to a packet too short).
    fn run(program: &[libc::sock_filter], payload: &[u8]) -> u32 {
        let (mut accumulator, mut pc) = (0u32, 0usize);
        loop {
            let op = program[pc];
            pc += 1;
            match op.code {
                LD_B_ABS => match payload.get(op.k as usize) {
                    Some(&b) => accumulator = b.into(),
                    None => return 0,
                },
                LD_H_ABS => match payload.get(op.k as usize..op.k as usize + 2) {
                    Some(h) => accumulator = u16::from_be_bytes([h[0], h[1]]).into(),
                    None => return 0,
                },
                JMP_JA => pc += op.k as usize,
                JMP_JEQ_K | JMP_JSET_K => {
                    let taken = if op.code == JMP_JEQ_K {
                        accumulator == op.k
                    } else {
                        accumulator & op.k != 0
                    };
                    pc += usize::from(if taken { op.jt } else { op.jf });
                }
                RET_K => return op.k,
                other => panic!("an opcode the test does not know: {other:#x}"),
            }
        }
    }

    fn long_header(dcid: &[u8]) -> Vec<u8> {
        let mut packet = vec![0xc0, 0, 0, 0, 1, dcid.len() as u8];
        packet.extend_from_slice(dcid);
        packet.extend_from_slice(&[8, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0]);
        packet
    }

    fn short_header(dcid: &[u8]) -> Vec<u8> {
        let mut packet = vec![0x40];
        packet.extend_from_slice(dcid);
        packet.extend_from_slice(&[0x11; 20]);
        packet
    }

    #[test]
    fn the_predecessors_packets_go_to_the_first_socket_and_the_rest_to_the_second() {
        let old = CidGeneration(7);
        let new = CidGeneration::after(Some(old));
        assert_eq!(new, CidGeneration(8));
        let program = steering_program(old);
        let old_cid = GenerationCids(old).generate_cid();
        let new_cid = GenerationCids(new).generate_cid();
        assert_eq!(old_cid.len(), CID_LEN);
        assert_eq!(&old_cid[..2], &[0, 7]);
        assert_eq!(run(&program, &short_header(&old_cid)), 0);
        assert_eq!(run(&program, &long_header(&old_cid)), 0, "a handshake");
        assert_eq!(run(&program, &short_header(&new_cid)), 1);
        assert_eq!(run(&program, &long_header(&new_cid)), 1);
        // A client's first Initial: an ID of its own choosing.
        let chosen = [0x9a, 0x31, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
        assert_eq!(run(&program, &long_header(&chosen)), 1);
    }

    #[test]
    fn generations_wrap_and_start_at_zero() {
        assert_eq!(CidGeneration::after(None), CidGeneration(0));
        assert_eq!(
            CidGeneration::after(Some(CidGeneration(u16::MAX))),
            CidGeneration(0)
        );
    }
}
