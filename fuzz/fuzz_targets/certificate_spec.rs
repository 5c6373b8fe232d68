//! The admin API's certificate document: PEM parsing, key match, chain order and validity,
//! refused with the field at fault, never a panic. The input is split on the first NUL into
//! the certificate PEM and the key PEM, so the fuzzer works on PEM text directly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_model::parse_certificate_spec;

const NOW_UNIX: i64 = 1_800_000_000;

fuzz_target!(|data: &[u8]| {
    let (cert, key) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &b""[..]),
    };
    let body = serde_json::json!({
        "cert_pem": String::from_utf8_lossy(cert),
        "key_pem": String::from_utf8_lossy(key),
        "allow_expired": true,
    });
    let _ = parse_certificate_spec("fuzz.example.com", &body, NOW_UNIX);
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = parse_certificate_spec("fuzz.example.com", &value, NOW_UNIX);
    }
});
