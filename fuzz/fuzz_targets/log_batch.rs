//! What logd reads from the network: batch frames and the per-app blocks inside them. A
//! damaged or hostile sender gets an error, never a panic or an unbounded allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_logs::frame;

fuzz_target!(|data: &[u8]| {
    let mut input = data;
    while let Ok(Some((_, payload))) = frame::read_batch(&mut input) {
        if let Ok(blocks) = frame::blocks(&payload) {
            let lines: usize = blocks.iter().map(|(_, lines)| lines.len()).sum();
            assert!(lines <= payload.len());
        }
    }
    let _ = frame::blocks(data);
    // What a sender encodes, a receiver reads back unchanged.
    if data.len() <= frame::MAX_BATCH_BYTES {
        let id = frame::BatchId {
            sender: 7,
            seq: data.len() as u64,
        };
        let encoded = frame::encode_batch(id, data);
        let read = frame::read_batch(&mut &encoded[..]).expect("an encoded batch reads back");
        assert_eq!(read, Some((id, data.to_vec())));
    }
    let _ = frame::read_ack(&mut &data[..]);
    let _ = frame::count_lines(data);
});
