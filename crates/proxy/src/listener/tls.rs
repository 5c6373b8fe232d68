//! TLS on the listener, with the profile, certificates and ticket keys of `crate::tls::settings`. The certificate is chosen before OpenSSL sees the connection: the
//! SNI name is read from the ClientHello with a peek, the certificate cache is asked
//! (asynchronously: a cold name's store read never holds the thread), and the handshake
//! starts with that certificate on the connection. OpenSSL's own SNI callback cannot wait,
//! and its client-hello callback cannot read the name without unsafe code.
//!
//! A ClientHello offering the `acme-tls/1` protocol is a CA validating a TLS-ALPN-01
//! challenge (RFC 8737): it is shown the answer an order of the fleet published in the
//! store for that name, and the connection ends with the handshake.

use std::pin::Pin;
use std::sync::Arc;

use openssl::ssl::{select_next_proto, AlpnError, Ssl, SslAcceptor, SslMethod};
use switchyard_store::{acme, Store};
use switchyard_tls_tickets::TicketKeys;
use tls_parser::{
    parse_tls_extensions, parse_tls_plaintext, SNIType, TlsExtension, TlsMessage,
    TlsMessageHandshake,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_openssl::SslStream;

use super::clock::Deadline;
use super::connection::peek_until;
use crate::tls::cert_cache::{CertCache, ServedCert};
use crate::tls::settings::{configure_context, count_completed, use_certificate, CertSelector};

/// A TLS record's header: type, version, length.
const RECORD_HEADER: usize = 5;
/// The largest TLS record (2^14 bytes of plaintext), so the largest ClientHello peeked.
const MAX_RECORD: usize = 16 * 1024;
/// A handshake record.
const HANDSHAKE_RECORD: u8 = 22;

/// ALPN offered, in the server's order of preference: HTTP/2, then HTTP/1.1.
const ALPN_H2_HTTP11: &[u8] = b"\x02h2\x08http/1.1";

/// The protocol of TLS-ALPN-01 validations, as ALPN's wire format lists it.
const ALPN_ACME_TLS: &[u8] = b"\x0aacme-tls/1";

/// The listener's TLS acceptor.
pub struct ListenerTls {
    acceptor: SslAcceptor,
    /// For TLS-ALPN-01 validations: `acme-tls/1` is the only protocol it agrees to.
    acme_acceptor: SslAcceptor,
    selector: CertSelector,
    /// Where the fleet's issuer publishes TLS-ALPN-01 answers.
    store: Arc<dyn Store>,
}

/// What a handshake led to.
pub(super) enum Accepted {
    /// A connection to serve.
    Serve(SslStream<TcpStream>),
    /// A CA's TLS-ALPN-01 validation, answered by the handshake itself.
    AcmeValidation,
}

/// What the router reads from a ClientHello before OpenSSL sees it.
#[derive(Debug, Default, PartialEq, Eq)]
struct Hello {
    server_name: Option<String>,
    /// The client offered `acme-tls/1`: a TLS-ALPN-01 validation.
    acme_tls: bool,
}

/// Why a TLS connection was not served.
#[derive(Debug)]
pub(super) enum HandshakeFailure {
    /// No ClientHello and handshake within the deadline.
    TimedOut,
    /// No certificate for the name (counted and logged by the selector).
    NoCertificate,
    /// The client or OpenSSL ended it.
    Failed(String),
}

impl std::fmt::Display for HandshakeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TimedOut => f.write_str("no handshake within the client header deadline"),
            Self::NoCertificate => f.write_str("no certificate for the server name"),
            Self::Failed(reason) => f.write_str(reason),
        }
    }
}

impl ListenerTls {
    /// An acceptor serving certificates from `certs`, resuming sessions with `tickets`, and
    /// answering TLS-ALPN-01 validations from `store`.
    pub fn new(
        certs: Arc<CertCache>,
        tickets: Arc<TicketKeys>,
        store: Arc<dyn Store>,
    ) -> Result<Self, String> {
        let setup_failed = |e: openssl::error::ErrorStack| format!("cannot set up TLS: {e}");
        let mut builder =
            SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).map_err(setup_failed)?;
        configure_context(&mut builder, tickets)?;
        builder.set_alpn_select_callback(|_, offered| {
            select_next_proto(ALPN_H2_HTTP11, offered).ok_or(AlpnError::NOACK)
        });
        let mut acme_builder =
            SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).map_err(setup_failed)?;
        // A validator that does not get `acme-tls/1` agreed must fail (RFC 8737, section 3).
        acme_builder.set_alpn_select_callback(|_, offered| {
            select_next_proto(ALPN_ACME_TLS, offered).ok_or(AlpnError::ALERT_FATAL)
        });
        Ok(Self {
            acceptor: builder.build(),
            acme_acceptor: acme_builder.build(),
            selector: CertSelector::new(certs),
            store,
        })
    }

    /// Reads the server name, chooses the certificate and completes the handshake, all
    /// before `deadline`.
    pub(super) async fn accept(
        &self,
        stream: TcpStream,
        deadline: &Deadline,
    ) -> Result<Accepted, HandshakeFailure> {
        let handshake = std::pin::pin!(self.handshake(stream));
        deadline
            .bound(handshake)
            .await
            .unwrap_or(Err(HandshakeFailure::TimedOut))
    }

    async fn handshake(&self, stream: TcpStream) -> Result<Accepted, HandshakeFailure> {
        let hello = peek_hello(&stream).await?;
        if hello.acme_tls {
            self.answer_acme_validation(stream, hello.server_name)
                .await?;
            return Ok(Accepted::AcmeValidation);
        }
        let cert = self
            .selector
            .choose(hello.server_name.as_deref())
            .await
            .ok_or(HandshakeFailure::NoCertificate)?;
        let mut ssl = Ssl::new(self.acceptor.context()).map_err(failed)?;
        if !self.selector.serve(&mut ssl, &cert) {
            return Err(HandshakeFailure::NoCertificate);
        }
        let mut tls = SslStream::new(ssl, stream).map_err(failed)?;
        Pin::new(&mut tls).accept().await.map_err(failed)?;
        count_completed(tls.ssl());
        Ok(Accepted::Serve(tls))
    }

    /// Shows a TLS-ALPN-01 validator the certificate published for its name, and closes.
    /// A name without a published answer gets no certificate at all: never the app's own
    /// or the default, which a validator would take as a failed challenge anyway.
    async fn answer_acme_validation(
        &self,
        stream: TcpStream,
        server_name: Option<String>,
    ) -> Result<(), HandshakeFailure> {
        let name = server_name.ok_or(HandshakeFailure::NoCertificate)?;
        let answer = match acme::tls_alpn_answer(self.store.as_ref(), &name).await {
            Ok(Some(answer)) => answer,
            Ok(None) => return Err(HandshakeFailure::NoCertificate),
            Err(e) => {
                log::warn!("cannot read the TLS-ALPN-01 answer for {name} from the store: {e}");
                return Err(HandshakeFailure::NoCertificate);
            }
        };
        let cert = ServedCert::from_pem(&answer.cert_pem, &answer.key_pem).map_err(failed)?;
        let mut ssl = Ssl::new(self.acme_acceptor.context()).map_err(failed)?;
        use_certificate(&mut ssl, &cert).map_err(failed)?;
        let mut tls = SslStream::new(ssl, stream).map_err(failed)?;
        Pin::new(&mut tls).accept().await.map_err(failed)?;
        log::info!("answered a TLS-ALPN-01 validation for {name}");
        let _ = tls.shutdown().await;
        Ok(())
    }
}

fn failed(e: impl std::fmt::Display) -> HandshakeFailure {
    HandshakeFailure::Failed(e.to_string())
}

/// The ClientHello waiting on `stream`, left unread for OpenSSL. No name when the client
/// sent none or what came is not a ClientHello OpenSSL could use either (it then fails the
/// handshake itself, or serves the default certificate).
async fn peek_hello(stream: &TcpStream) -> Result<Hello, HandshakeFailure> {
    let mut buffer = vec![0u8; RECORD_HEADER + MAX_RECORD];
    peek_until(stream, &mut buffer, |data| {
        if data[0] != HANDSHAKE_RECORD {
            return Some(Hello::default());
        }
        // A ClientHello spanning TCP segments has come in part: wait for the rest.
        let length = usize::from(u16::from_be_bytes([*data.get(3)?, *data.get(4)?]));
        (data.len() >= RECORD_HEADER + length.min(MAX_RECORD)).then(|| hello_in(data))
    })
    .await
    .map_err(failed)
}

/// The host name and ALPN offer of a ClientHello record (a ClientHello split over several
/// records, which no mainstream client sends, gets the default certificate).
fn hello_in(record: &[u8]) -> Hello {
    let Ok((_, plaintext)) = parse_tls_plaintext(record) else {
        return Hello::default();
    };
    let Some(extensions) = plaintext.msg.iter().find_map(|message| match message {
        TlsMessage::Handshake(TlsMessageHandshake::ClientHello(hello)) => hello.ext,
        _ => None,
    }) else {
        return Hello::default();
    };
    let Ok((_, extensions)) = parse_tls_extensions(extensions) else {
        return Hello::default();
    };
    let mut hello = Hello::default();
    for extension in &extensions {
        match extension {
            TlsExtension::SNI(names) => {
                hello.server_name = names
                    .iter()
                    .find(|(kind, _)| *kind == SNIType::HostName)
                    .and_then(|(_, name)| std::str::from_utf8(name).ok())
                    .map(str::to_owned);
            }
            TlsExtension::ALPN(protocols) => {
                hello.acme_tls = protocols.iter().any(|p| *p == &ALPN_ACME_TLS[1..]);
            }
            _ => {}
        }
    }
    hello
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello as OpenSSL's client sends it for `name`, captured through a memory
    /// pipe so the test needs no network.
    fn client_hello(name: Option<&str>) -> Vec<u8> {
        client_hello_offering(name, None)
    }

    fn client_hello_offering(name: Option<&str>, alpn: Option<&[u8]>) -> Vec<u8> {
        use openssl::ssl::{SslConnector, SslVerifyMode};
        use std::io::{Read, Write};

        struct Captured(Vec<u8>);
        impl Read for Captured {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::WouldBlock.into())
            }
        }
        impl Write for Captured {
            fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
                self.0.extend_from_slice(data);
                Ok(data.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut connector = SslConnector::builder(SslMethod::tls_client()).expect("connector");
        connector.set_verify(SslVerifyMode::NONE);
        if let Some(protocols) = alpn {
            connector.set_alpn_protos(protocols).expect("alpn");
        }
        let mut config = connector.build().configure().expect("configure");
        config.set_use_server_name_indication(name.is_some());
        config.set_verify_hostname(false);
        let ssl = config.into_ssl(name.unwrap_or("ignored")).expect("ssl");
        let hello = match ssl.connect(Captured(Vec::new())) {
            Err(openssl::ssl::HandshakeError::WouldBlock(mid)) => mid.get_ref().0.clone(),
            _ => panic!("the client should wait for the server's answer"),
        };
        hello
    }

    #[test]
    fn the_name_is_read_from_a_real_client_hello() {
        let hello = client_hello(Some("app-1.example.test"));
        assert_eq!(hello[0], HANDSHAKE_RECORD);
        assert_eq!(
            hello_in(&hello),
            Hello {
                server_name: Some("app-1.example.test".into()),
                acme_tls: false
            }
        );
    }

    #[test]
    fn a_hello_without_a_name_or_garbage_has_none() {
        assert_eq!(hello_in(&client_hello(None)), Hello::default());
        assert_eq!(hello_in(b"GET / HTTP/1.1\r\n\r\n"), Hello::default());
        let hello = client_hello(Some("cut.example.test"));
        assert_eq!(hello_in(&hello[..hello.len() / 2]), Hello::default());
    }

    #[test]
    fn only_a_hello_offering_acme_tls_is_a_validation() {
        let validation = client_hello_offering(Some("a.example.test"), Some(ALPN_ACME_TLS));
        assert!(hello_in(&validation).acme_tls);
        let browser = client_hello_offering(Some("a.example.test"), Some(ALPN_H2_HTTP11));
        assert!(!hello_in(&browser).acme_tls);
        // A prefix of the protocol's name is another protocol.
        let lookalike = client_hello_offering(Some("a.example.test"), Some(b"\x08acme-tls"));
        assert!(!hello_in(&lookalike).acme_tls);
    }
}
