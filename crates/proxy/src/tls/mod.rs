//! TLS for the HTTPS listener: the context's settings and rotating session-ticket keys
//! (`settings`), certificates chosen by SNI from a bounded cache over the store
//! (`cert_cache`), the same certificates for QUIC's rustls (`quic`), and the scan that
//! reports certificates about to expire (`cert_expiry`).
//! The handshake itself is the listener's (`listener/tls.rs`).

pub(crate) mod cert_cache;
pub(crate) mod cert_expiry;
mod name_index;
pub(crate) mod quic;
pub(crate) mod settings;
