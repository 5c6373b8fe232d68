//! Host headers and TLS server names are the first thing the router reads from a client.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_model::{covers, normalize_host, Domain};

fuzz_target!(|data: &[u8]| {
    let Ok(host) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(normalized) = normalize_host(host) {
        assert!(!normalized.ends_with('.'), "{host:?} → {normalized:?}");
        assert!(!normalized.contains(':'), "{host:?} → {normalized:?}");
        assert_eq!(normalized, normalized.to_ascii_lowercase());
        assert_eq!(
            normalize_host(&normalized).as_deref(),
            Some(normalized.as_str())
        );
        if let Ok(domain) = Domain::parse(&normalized) {
            assert!(covers(domain.as_str(), &normalized) || domain.is_wildcard());
        }
    }
    // Whatever a client sends as SNI is compared with stored names; it must never panic.
    let _ = covers("*.example.com", host);
    let _ = covers(host, "a.example.com");
});
