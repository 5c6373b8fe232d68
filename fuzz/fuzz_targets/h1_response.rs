//! A backend's answer head, read as the router reads it (`crates/h1`) and written again
//! for an HTTP/1.x client (`write_response_parts`, the client driver's writer), must read
//! back as the same answer: the same status, the same end-to-end fields in the same order,
//! exactly the framing the router chose (one Content-Length, or chunked with the app's
//! other codings ahead of it, or none), the connection kept or closed as the router said,
//! and nothing after the head. An answer whose head the client would read otherwise
//! (a field that ends the head early, a second length) would desynchronise the client's
//! connection.
//!
//! Both writers the driver has are held to this: the one from a map (`write_response_parts`,
//! for answers a stage read) and the one from the fields as read (`AnswerFields` and
//! `write_answer_head`, for the rest), which must also give the client the same fields.
#![no_main]

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, DATE, TRANSFER_ENCODING};
use http::HeaderMap;
use libfuzzer_sys::fuzz_target;
use switchyard_h1::{
    fields_map, header_slots, parse_response, place_fields, response_parts, write_answer_head,
    write_response_parts, AnswerConnection, AnswerFields, AnswerFraming, ResponseBody,
    ResponseError, MAX_HEADERS,
};

const DATE_VALUE: &[u8] = b"Sat, 28 Nov 2026 04:00:00 GMT";

/// The fields a client must see as the app sent them: all but the framing and the Date
/// the router may add.
fn end_to_end(headers: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .filter(|(name, _)| ![CONTENT_LENGTH, TRANSFER_ENCODING, DATE].contains(name))
        .map(|(name, value)| (name.as_str().to_string(), value.as_bytes().to_vec()))
        .collect()
}

fuzz_target!(|data: &[u8]| {
    for answers_head in [false, true] {
        let mut slots = header_slots();
        let Ok(Some(head)) = parse_response(data, &mut slots, answers_head) else {
            continue;
        };
        // Interim answers are dropped and a 101 keeps every field: neither is written here.
        if head.is_interim() || head.code == 101 {
            continue;
        }
        let Ok(status) = http::StatusCode::from_u16(head.code) else {
            continue;
        };
        // The fields placed and made into a map as the router does (backend_h1's
        // AnswerHead): end-to-end ones, and the codings the client undoes.
        let mut places = Vec::new();
        let facts = place_fields(&head, data, false, &mut places);
        let bytes = Bytes::copy_from_slice(data);
        let Ok(headers) = fields_map(&bytes, &places) else {
            continue;
        };
        let as_read = AnswerFields::new(bytes.clone(), &places);
        // What place_fields noted as it placed them is what a walk of the placed reads.
        let noted = AnswerFields::placed(bytes, &places, facts);
        assert_eq!(
            (noted.content_length(), noted.has_codings()),
            (as_read.content_length(), as_read.has_codings())
        );
        let framings = match head.body {
            ResponseBody::None => [AnswerFraming::NoBody, AnswerFraming::NoBody],
            ResponseBody::Length(length) => [AnswerFraming::Length(length), AnswerFraming::Chunked],
            ResponseBody::Chunked | ResponseBody::UntilClose => {
                [AnswerFraming::Chunked, AnswerFraming::UntilClose]
            }
        };
        for framing in framings {
            for connection in [
                AnswerConnection::Kept,
                AnswerConnection::KeptForHttp10,
                AnswerConnection::Closed,
            ] {
                for from_map in [true, false] {
                    let mut written = Vec::new();
                    if from_map {
                        write_response_parts(
                            &mut written,
                            status,
                            &headers,
                            framing,
                            connection,
                            || DATE_VALUE,
                        );
                    } else {
                        let fields = || as_read.iter();
                        write_answer_head(
                            &mut written,
                            status,
                            fields,
                            framing,
                            connection,
                            || DATE_VALUE,
                        );
                    }
                    let mut again_slots = header_slots();
                    let again = match parse_response(&written, &mut again_slots, answers_head) {
                        Ok(Some(again)) => again,
                        // The router's own lines (framing, Connection, Date) can take an answer
                        // of 100 lines past the 100 this codec reads (as hyper's client, as
                        // HAProxy's 101); clients read more. Only that is not a divergence
                        // (status line, fields, blank line: fields + 3 pieces split on LF).
                        Err(ResponseError::HeadTooLarge)
                            if written.split(|&b| b == b'\n').count() > MAX_HEADERS + 3 =>
                        {
                            continue
                        }
                        other => panic!("written answer does not read back: {other:?} {written:?}"),
                    };
                    assert_eq!(
                        again.head_len,
                        written.len(),
                        "bytes after the head: {written:?}"
                    );
                    assert_eq!(again.code, status.as_u16());
                    match framing {
                        AnswerFraming::Length(length) => {
                            assert_eq!(again.body, ResponseBody::Length(length), "{written:?}")
                        }
                        AnswerFraming::Chunked => {
                            assert_eq!(again.body, ResponseBody::Chunked, "{written:?}");
                            assert_eq!(again.other_codings, head.other_codings, "{written:?}");
                        }
                        AnswerFraming::UntilClose => {
                            assert_eq!(again.body, ResponseBody::UntilClose, "{written:?}")
                        }
                        AnswerFraming::NoBody => assert_eq!(again.body, ResponseBody::None),
                    }
                    if framing != AnswerFraming::UntilClose {
                        assert_eq!(
                            again.keeps_connection(),
                            connection != AnswerConnection::Closed,
                            "{written:?}"
                        );
                    }
                    let (_, read_back) = response_parts(&again).expect("fields read back");
                    assert_eq!(end_to_end(&read_back), end_to_end(&headers), "{written:?}");
                }
            }
        }
    }
});
