//! TLS for the HTTP/3 listener: QUIC's handshake is rustls's (the only TLS quinn speaks),
//! serving the very certificates the OpenSSL listener serves — chosen by SNI from the same
//! certificate cache, so a certificate changed in the store is served on the next handshake
//! of either. rustls picks the certificate in a callback that cannot wait, so only what the
//! cache holds in memory is served there: the listener loads the stored certificates before
//! its first handshake (`CertCache::warm`); a name still not in memory fails that handshake
//! and starts the lookup, and the client's next attempt is served.
//!
//! Each certificate is converted to rustls's form once, by its fingerprint, in a bounded
//! cache. 0-RTT is off unless `--http3-early-data on`; then resumption is stateful (a
//! session is taken from [`SESSIONS`] once, so the same early data is not taken twice by
//! this process) and the listener decides what early requests may do (`listener::h3`).

use std::sync::Arc;

use quick_cache::sync::Cache;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::metrics;
use crate::tls::cert_cache::{CertCache, Selected, ServedCert};

/// ALPN of HTTP/3 (RFC 9114 §3.1).
const ALPN_H3: &[u8] = b"h3";

/// Certificates kept converted: as many as the certificate cache keeps parsed, at most.
const CONVERTED: usize = 10_000;

/// Sessions kept for resumption (and so for 0-RTT), the least recent forgotten first; each
/// a few hundred bytes.
const SESSIONS: usize = 16_384;

/// The rustls server configuration of the HTTP/3 listener; `early_data`: 0-RTT taken.
pub(crate) fn server_config(
    certs: Arc<CertCache>,
    early_data: bool,
) -> Result<rustls::ServerConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("TLS 1.3 for QUIC: {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(QuicCerts {
            certs,
            converted: Cache::new(CONVERTED),
        }));
    config.alpn_protocols = vec![ALPN_H3.to_vec()];
    config.session_storage = rustls::server::ServerSessionMemoryCache::new(SESSIONS);
    // QUIC carries early data in its own packets: the TLS limit is all or nothing (RFC 9001
    // §4.6.1).
    config.max_early_data_size = if early_data { u32::MAX } else { 0 };
    Ok(config)
}

/// The certificate cache, as rustls asks it.
struct QuicCerts {
    certs: Arc<CertCache>,
    /// rustls's form of each certificate served, by fingerprint.
    converted: Cache<String, Arc<CertifiedKey>>,
}

impl std::fmt::Debug for QuicCerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("QuicCerts")
    }
}

impl ResolvesServerCert for QuicCerts {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let served = match self.certs.select_cached(hello.server_name()) {
            Some(Selected::Stored(cert) | Selected::Default(cert)) => cert,
            Some(Selected::Nothing) => return None,
            None => {
                metrics::QUIC_HANDSHAKES
                    .with_label_values(&["certificate_cold"])
                    .inc();
                return None;
            }
        };
        if let Some(key) = self.converted.get(&served.sha256) {
            return Some(key);
        }
        match converted(&served) {
            Ok(key) => {
                let key = Arc::new(key);
                self.converted.insert(served.sha256.clone(), key.clone());
                Some(key)
            }
            Err(e) => {
                log::error!(
                    "certificate {} cannot be served over QUIC: {e}",
                    served.sha256
                );
                None
            }
        }
    }
}

/// A certificate the OpenSSL listener serves, in rustls's form: DER chain, PKCS#8 key.
fn converted(served: &ServedCert) -> Result<CertifiedKey, String> {
    let mut chain = Vec::with_capacity(1 + served.chain.len());
    for cert in std::iter::once(&served.leaf).chain(&served.chain) {
        let der = cert.to_der().map_err(|e| e.to_string())?;
        chain.push(CertificateDer::from(der));
    }
    let pkcs8 = served
        .key
        .private_key_to_pkcs8()
        .map_err(|e| e.to_string())?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pkcs8));
    let signer = rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| e.to_string())?;
    Ok(CertifiedKey::new(chain, signer))
}

#[cfg(test)]
mod tests {
    use super::*;
    use openssl::ec::{EcGroup, EcKey};
    use openssl::nid::Nid;
    use openssl::pkey::PKey;
    use openssl::x509::{X509Name, X509};
    use rustls::SignatureScheme;

    /// A self-signed P-256 certificate for `name`, as PEM chain and key.
    fn self_signed(name: &str) -> (String, String) {
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).expect("P-256");
        let key = PKey::from_ec_key(EcKey::generate(&group).expect("a key")).expect("a key");
        let mut subject = X509Name::builder().expect("a name");
        subject.append_entry_by_text("CN", name).expect("CN");
        let subject = subject.build();
        let mut cert = X509::builder().expect("a builder");
        cert.set_version(2).expect("v3");
        cert.set_subject_name(&subject).expect("subject");
        cert.set_issuer_name(&subject).expect("issuer");
        cert.set_pubkey(&key).expect("key");
        let now = openssl::asn1::Asn1Time::days_from_now(0).expect("now");
        let later = openssl::asn1::Asn1Time::days_from_now(1).expect("later");
        cert.set_not_before(&now).expect("not before");
        cert.set_not_after(&later).expect("not after");
        cert.sign(&key, openssl::hash::MessageDigest::sha256())
            .expect("signed");
        let pem = |bytes: Vec<u8>| String::from_utf8(bytes).expect("PEM is text");
        (
            pem(cert.build().to_pem().expect("PEM")),
            pem(key.private_key_to_pem_pkcs8().expect("PEM")),
        )
    }

    #[test]
    fn the_listeners_certificate_is_served_to_quic_with_its_own_key() {
        let (cert, key) = self_signed("shop.test");
        let served = ServedCert::from_pem(&cert, &key).expect("a certificate");
        let certified = converted(&served).expect("converted");
        assert_eq!(certified.cert.len(), 1);
        assert_eq!(
            certified.cert[0].as_ref(),
            served.leaf.to_der().expect("DER").as_slice()
        );
        assert!(certified
            .key
            .choose_scheme(&[SignatureScheme::ECDSA_NISTP256_SHA256])
            .is_some());
    }
}
