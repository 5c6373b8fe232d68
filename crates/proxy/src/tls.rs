//! The HTTPS listener's TLS: Mozilla's intermediate profile (TLS 1.2 and 1.3), ALPN `h2` and
//! `http/1.1`, a certificate chosen per handshake from the SNI name through the
//! [`CertCache`], and session tickets sealed with rotating keys.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use pingora::listeners::tls::TlsSettings;
use pingora::listeners::TlsAccept;
use pingora::protocols::tls::TlsRef;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use pingora::tls::ext;
use pingora::tls::ssl::{NameType, SslOptions};
use switchyard_tls_tickets::TicketKeys;

use crate::cert_cache::{CertCache, Selected, ServedCert};
use crate::metrics;

/// Chooses each handshake's certificate.
pub(crate) struct CertSelector {
    certs: Arc<CertCache>,
    last_refusal_log: AtomicU64,
}

impl CertSelector {
    fn new(certs: Arc<CertCache>) -> Self {
        Self {
            certs,
            last_refusal_log: AtomicU64::new(0),
        }
    }

    /// Logs at most once a second: a scan of random SNI names must not flood the log.
    fn log_refusal(&self, server_name: Option<&str>, reason: &str) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let last = self.last_refusal_log.swap(now, Ordering::Relaxed);
        if last != now {
            log::warn!(
                "TLS handshake refused for server name {:?}: {reason} \
                 (logged at most once a second; see switchyard_tls_handshakes_total)",
                server_name.unwrap_or("<none>")
            );
        }
    }
}

#[async_trait]
impl TlsAccept for CertSelector {
    async fn certificate_callback(&self, ssl: &mut TlsRef) {
        let server_name = ssl.servername(NameType::HOST_NAME).map(str::to_owned);
        let cert = match self.certs.select(server_name.as_deref()).await {
            Ok(Selected::Stored(cert) | Selected::Default(cert)) => cert,
            Ok(Selected::Nothing) => {
                metrics::TLS_HANDSHAKES
                    .with_label_values(&["no_certificate"])
                    .inc();
                self.log_refusal(server_name.as_deref(), "no certificate and no default");
                return;
            }
            Err(e) => {
                metrics::TLS_HANDSHAKES
                    .with_label_values(&["store_error"])
                    .inc();
                self.log_refusal(server_name.as_deref(), &format!("certificate lookup: {e}"));
                return;
            }
        };
        // Without a certificate OpenSSL ends the handshake with a handshake_failure alert.
        if let Err(e) = use_certificate(ssl, &cert) {
            metrics::TLS_HANDSHAKES
                .with_label_values(&["store_error"])
                .inc();
            self.log_refusal(server_name.as_deref(), &format!("OpenSSL refused it: {e}"));
        }
    }

    async fn handshake_complete_callback(
        &self,
        ssl: &TlsRef,
    ) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        let result = if ssl.session_reused() {
            "resumed"
        } else {
            "full"
        };
        metrics::TLS_HANDSHAKES.with_label_values(&[result]).inc();
        None
    }
}

fn use_certificate(ssl: &mut TlsRef, cert: &ServedCert) -> Result<(), openssl::error::ErrorStack> {
    ext::ssl_use_certificate(ssl, &cert.leaf)?;
    ext::ssl_use_private_key(ssl, &cert.key)?;
    for intermediate in &cert.chain {
        ext::ssl_add_chain_cert(ssl, intermediate)?;
    }
    Ok(())
}

/// Key-exchange groups offered, in order of preference (Mozilla intermediate, v5.7).
const KEY_EXCHANGE_GROUPS: &str = "X25519:P-256:P-384";

/// TLS settings for the HTTPS listener: certificates from `certs`, tickets under `tickets`.
pub fn https_settings(
    certs: Arc<CertCache>,
    tickets: Arc<TicketKeys>,
) -> Result<TlsSettings, String> {
    let mut settings = TlsSettings::with_callbacks(Box::new(CertSelector::new(certs)))
        .map_err(|e| format!("cannot set up TLS: {e}"))?;
    settings.enable_h2();
    // Mozilla's intermediate profile lists these groups; OpenSSL's default also offers
    // X448 and P-521, which no mainstream client needs and which scanners flag.
    settings
        .set_groups_list(KEY_EXCHANGE_GROUPS)
        .map_err(|e| format!("cannot set the TLS key-exchange groups: {e}"))?;
    // The server picks from its own (Mozilla-ordered, all strong) list so a client cannot
    // steer a TLS 1.2 handshake to its weakest common cipher; a client that puts ChaCha20
    // first (no AES hardware: phones) still gets it.
    settings.set_options(SslOptions::CIPHER_SERVER_PREFERENCE | SslOptions::PRIORITIZE_CHACHA);
    switchyard_tls_tickets::install(&mut settings, tickets)
        .map_err(|e| format!("cannot install session-ticket keys: {e}"))?;
    Ok(settings)
}

/// Rotates the session-ticket keys every `interval`.
pub struct TicketKeyRotation {
    keys: Arc<TicketKeys>,
    interval: Duration,
}

impl TicketKeyRotation {
    /// Rotation of `keys` every `interval`.
    pub fn new(keys: Arc<TicketKeys>, interval: Duration) -> Self {
        Self { keys, interval }
    }
}

#[async_trait]
impl BackgroundService for TicketKeyRotation {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.tick().await;
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = shutdown.changed() => return,
            }
            match self.keys.rotate() {
                Ok(()) => metrics::TICKET_KEY_ROTATIONS.inc(),
                Err(e) => log::error!("cannot rotate session-ticket keys: {e}"),
            }
        }
    }
}
