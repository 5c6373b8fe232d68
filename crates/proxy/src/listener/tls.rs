//! TLS on the listener, with the profile, certificates and ticket keys of `crate::tls::settings`. The certificate is chosen before OpenSSL sees the connection: the
//! SNI name is read from the ClientHello with a peek, the certificate cache is asked
//! (asynchronously: a cold name's store read never holds the thread), and the handshake
//! starts with that certificate on the connection. OpenSSL's own SNI callback cannot wait,
//! and its client-hello callback cannot read the name without unsafe code.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use openssl::ssl::{select_next_proto, AlpnError, Ssl, SslAcceptor, SslMethod};
use switchyard_tls_tickets::TicketKeys;
use tls_parser::{
    parse_tls_extensions, parse_tls_plaintext, SNIType, TlsExtension, TlsMessage,
    TlsMessageHandshake,
};
use tokio::net::TcpStream;
use tokio_openssl::SslStream;

use super::peek_until;
use crate::tls::cert_cache::CertCache;
use crate::tls::settings::{configure_context, count_completed, CertSelector};

/// A TLS record's header: type, version, length.
const RECORD_HEADER: usize = 5;
/// The largest TLS record (2^14 bytes of plaintext), so the largest ClientHello peeked.
const MAX_RECORD: usize = 16 * 1024;
/// A handshake record.
const HANDSHAKE_RECORD: u8 = 22;

/// ALPN offered, in the server's order of preference: HTTP/2, then HTTP/1.1.
const ALPN_H2_HTTP11: &[u8] = b"\x02h2\x08http/1.1";

/// The listener's TLS acceptor.
pub struct ListenerTls {
    acceptor: SslAcceptor,
    selector: CertSelector,
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
    /// An acceptor serving certificates from `certs` and resuming sessions with `tickets`.
    pub fn new(certs: Arc<CertCache>, tickets: Arc<TicketKeys>) -> Result<Self, String> {
        let mut builder = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())
            .map_err(|e| format!("cannot set up TLS: {e}"))?;
        configure_context(&mut builder, tickets)?;
        builder.set_alpn_select_callback(|_, offered| {
            select_next_proto(ALPN_H2_HTTP11, offered).ok_or(AlpnError::NOACK)
        });
        Ok(Self {
            acceptor: builder.build(),
            selector: CertSelector::new(certs),
        })
    }

    /// Reads the server name, chooses the certificate and completes the handshake, all
    /// within `deadline`.
    pub(super) async fn accept(
        &self,
        stream: TcpStream,
        deadline: Duration,
    ) -> Result<SslStream<TcpStream>, HandshakeFailure> {
        tokio::time::timeout(deadline, self.handshake(stream))
            .await
            .unwrap_or(Err(HandshakeFailure::TimedOut))
    }

    async fn handshake(&self, stream: TcpStream) -> Result<SslStream<TcpStream>, HandshakeFailure> {
        let server_name = peek_server_name(&stream).await?;
        let cert = self
            .selector
            .choose(server_name.as_deref())
            .await
            .ok_or(HandshakeFailure::NoCertificate)?;
        let mut ssl = Ssl::new(self.acceptor.context()).map_err(failed)?;
        if !self.selector.serve(&mut ssl, &cert) {
            return Err(HandshakeFailure::NoCertificate);
        }
        let mut tls = SslStream::new(ssl, stream).map_err(failed)?;
        Pin::new(&mut tls).accept().await.map_err(failed)?;
        count_completed(tls.ssl());
        Ok(tls)
    }
}

fn failed(e: impl std::fmt::Display) -> HandshakeFailure {
    HandshakeFailure::Failed(e.to_string())
}

/// The SNI name of the ClientHello waiting on `stream`, left unread for OpenSSL. `None` when
/// the client sent no name or what came is not a ClientHello OpenSSL could use either (it
/// then fails the handshake itself, or serves the default certificate).
async fn peek_server_name(stream: &TcpStream) -> Result<Option<String>, HandshakeFailure> {
    let mut buffer = vec![0u8; RECORD_HEADER + MAX_RECORD];
    peek_until(stream, &mut buffer, |data| {
        if data[0] != HANDSHAKE_RECORD {
            return Some(None);
        }
        // A ClientHello spanning TCP segments has come in part: wait for the rest.
        let length = usize::from(u16::from_be_bytes([*data.get(3)?, *data.get(4)?]));
        (data.len() >= RECORD_HEADER + length.min(MAX_RECORD)).then(|| server_name_in(data))
    })
    .await
    .map_err(failed)
}

/// The host name in a ClientHello record (a ClientHello split over several records, which
/// no mainstream client sends, gets the default certificate).
fn server_name_in(record: &[u8]) -> Option<String> {
    let (_, plaintext) = parse_tls_plaintext(record).ok()?;
    let hello = plaintext.msg.iter().find_map(|message| match message {
        TlsMessage::Handshake(TlsMessageHandshake::ClientHello(hello)) => Some(hello),
        _ => None,
    })?;
    let (_, extensions) = parse_tls_extensions(hello.ext?).ok()?;
    extensions.iter().find_map(|extension| match extension {
        TlsExtension::SNI(names) => names
            .iter()
            .find(|(kind, _)| *kind == SNIType::HostName)
            .and_then(|(_, name)| std::str::from_utf8(name).ok())
            .map(str::to_owned),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello as OpenSSL's client sends it for `name`, captured through a memory
    /// pipe so the test needs no network.
    fn client_hello(name: Option<&str>) -> Vec<u8> {
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
            server_name_in(&hello).as_deref(),
            Some("app-1.example.test")
        );
    }

    #[test]
    fn a_hello_without_a_name_or_garbage_has_none() {
        assert_eq!(server_name_in(&client_hello(None)), None);
        assert_eq!(server_name_in(b"GET / HTTP/1.1\r\n\r\n"), None);
        let hello = client_hello(Some("cut.example.test"));
        assert_eq!(server_name_in(&hello[..hello.len() / 2]), None);
    }
}
