//! Switchyard's HTTP/1.1 codec, the part of the request path a router owns as nginx, HAProxy
//! and Sozu own theirs.
//!
//! A head is parsed in place by `httparse` into a caller's fixed array of header slices
//! (no allocation, no header map); the framing of the message is decided once, strictly,
//! so that the router and whatever reads the bytes it forwards cannot disagree about where
//! a message ends; the head is then written once, hop-by-hop fields left out and the framing
//! made canonical, into a buffer the connection reuses. Chunked bodies are re-framed chunk
//! by chunk (sizes in canonical hex, extensions dropped) rather than passed through.
//!
//! The codec does no I/O: a driver reads into its buffer, asks for a head, forwards the
//! written head and the body the framing names, and reads again.

mod answer_fields;
mod bridge;
mod chunked;
mod fields;
mod request;
mod response;
mod write;

pub use answer_fields::{
    fields_map, place_fields, AnswerFacts, AnswerFields, FieldPlace, PlacedFields,
};
pub use bridge::{
    coding_fields, end_to_end_fields, response_parts, write_answer_head,
    write_placed_request_fields, write_request_fields, write_request_parts, write_response_parts,
    AnswerConnection, AnswerFraming, BridgeError, OwnFields, RouterFieldsOnly,
};
pub use chunked::{write_chunk_size, ChunkedError, ChunkedReframer, Reframed};
pub use fields::{content_length_value, Connection};
pub use request::{parse_request, RequestBody, RequestError, RequestHead};
pub use response::{parse_response, ResponseBody, ResponseError, ResponseHead};
pub use write::{write_request_head, write_response_head, ClientSide};

/// The header lines a head may carry; more get 431 (hyper's default and HAProxy's limit
/// of 101 are of the same size).
pub const MAX_HEADERS: usize = 100;

/// The largest head read before the request is refused with 431.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// The array a head's header lines are parsed into; the caller keeps one per connection
/// or on its stack, and nothing of it needs clearing between requests.
pub type HeaderSlots<'b> = [std::mem::MaybeUninit<httparse::Header<'b>>; MAX_HEADERS];

/// An empty [`HeaderSlots`].
pub fn header_slots<'b>() -> HeaderSlots<'b> {
    [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS]
}

pub use httparse::Header;
