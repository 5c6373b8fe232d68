//! The admin API's app document: every field validated, an error naming the field, no panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_model::{parse_app_spec, parse_backends_spec};

fuzz_target!(|data: &[u8]| {
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    match parse_app_spec("fuzzed", &body) {
        Ok(_) => {}
        Err(error) => assert!(!error.to_string().is_empty()),
    }
    let _ = parse_backends_spec(&body);
});
