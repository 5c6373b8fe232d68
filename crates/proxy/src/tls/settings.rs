//! The HTTPS listener's TLS: Mozilla's intermediate profile (TLS 1.2 and 1.3), ALPN `h2` and
//! `http/1.1`, a certificate chosen per handshake from the SNI name through the
//! [`CertCache`], and session tickets sealed with rotating keys.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::shutdown::ShutdownWatch;
use openssl::ssl::{NameType, SslContextBuilder, SslMode, SslOptions, SslRef};
use switchyard_tls_tickets::TicketKeys;

use crate::metrics;
use crate::tls::cert_cache::{CertCache, Selected, ServedCert};

/// Chooses each handshake's certificate.
pub(crate) struct CertSelector {
    certs: Arc<CertCache>,
    last_refusal_log: AtomicU64,
}

impl CertSelector {
    pub(crate) fn new(certs: Arc<CertCache>) -> Self {
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

impl CertSelector {
    /// The certificate a handshake for `server_name` is served, counted and logged when
    /// there is none (the handshake then fails with a handshake_failure alert).
    pub(crate) async fn choose(&self, server_name: Option<&str>) -> Option<Arc<ServedCert>> {
        match self.certs.select(server_name).await {
            Ok(Selected::Stored(cert) | Selected::Default(cert)) => Some(cert),
            Ok(Selected::Nothing) => {
                metrics::TLS_HANDSHAKES
                    .with_label_values(&["no_certificate"])
                    .inc();
                self.log_refusal(server_name, "no certificate and no default");
                None
            }
            Err(e) => {
                metrics::TLS_HANDSHAKES
                    .with_label_values(&["store_error"])
                    .inc();
                self.log_refusal(server_name, &format!("certificate lookup: {e}"));
                None
            }
        }
    }

    /// Puts `cert` on one connection's handshake; false (counted, logged) when OpenSSL
    /// refuses it.
    pub(crate) fn serve(&self, ssl: &mut SslRef, cert: &ServedCert) -> bool {
        match use_certificate(ssl, cert) {
            Ok(()) => true,
            Err(e) => {
                metrics::TLS_HANDSHAKES
                    .with_label_values(&["store_error"])
                    .inc();
                let name = ssl.servername(NameType::HOST_NAME).map(str::to_owned);
                self.log_refusal(name.as_deref(), &format!("OpenSSL refused it: {e}"));
                false
            }
        }
    }
}

/// Counts a completed handshake as full or resumed.
pub(crate) fn count_completed(ssl: &SslRef) {
    let result = if ssl.session_reused() {
        "resumed"
    } else {
        "full"
    };
    metrics::TLS_HANDSHAKES.with_label_values(&[result]).inc();
}

pub(crate) fn use_certificate(
    ssl: &mut SslRef,
    cert: &ServedCert,
) -> Result<(), openssl::error::ErrorStack> {
    ssl.set_certificate(&cert.leaf)?;
    ssl.set_private_key(&cert.key)?;
    for intermediate in &cert.chain {
        ssl.add_chain_cert(intermediate.clone())?;
    }
    Ok(())
}

/// Key-exchange groups offered, in order of preference (Mozilla intermediate, v5.7).
const KEY_EXCHANGE_GROUPS: &str = "X25519:P-256:P-384";

/// What the TLS listener's context sets: key-exchange groups, cipher order, no
/// renegotiation, buffers released while idle, and the rotating session-ticket keys.
pub(crate) fn configure_context(
    context: &mut SslContextBuilder,
    tickets: Arc<TicketKeys>,
) -> Result<(), String> {
    // Mozilla's intermediate profile lists these groups; OpenSSL's default also offers
    // X448 and P-521, which no mainstream client needs and which scanners flag.
    context
        .set_groups_list(KEY_EXCHANGE_GROUPS)
        .map_err(|e| format!("cannot set the TLS key-exchange groups: {e}"))?;
    // The server picks from its own (Mozilla-ordered, all strong) list so a client cannot
    // steer a TLS 1.2 handshake to its weakest common cipher; a client that puts ChaCha20
    // first (no AES hardware: phones) still gets it. Client-started renegotiation is a
    // CPU lever for an attacker and nothing a browser needs (nginx refuses it too).
    context.set_options(
        SslOptions::CIPHER_SERVER_PREFERENCE
            | SslOptions::PRIORITIZE_CHACHA
            | SslOptions::NO_RENEGOTIATION,
    );
    // An idle connection gives its ~34 KiB of OpenSSL read and write buffers back, as
    // nginx's do: a router holds far more idle connections than busy ones.
    context.set_mode(SslMode::RELEASE_BUFFERS);
    switchyard_tls_tickets::install(context, tickets)
        .map_err(|e| format!("cannot install session-ticket keys: {e}"))
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

    /// Runs until `shutdown` changes.
    pub async fn run(&self, mut shutdown: ShutdownWatch) {
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
