//! The PROXY protocol header (HAProxy's, versions 1 and 2) that opens a connection to the
//! backends of an app that asks for it: the client's address and the one it reached, for
//! servers that read the client on the connection rather than in `X-Forwarded-For`. The
//! router's own connections to those backends (health checks, background revalidations,
//! image originals) open with the header's "local" form, which tells the server the
//! connection is the router's and its own addresses stand.

use std::net::{IpAddr, SocketAddr};

use ppp::v2;
use switchyard_model::ProxyProtocol;

/// Where a client connection came from and which of the router's addresses it reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ClientEnds {
    pub(crate) client: SocketAddr,
    pub(crate) reached: SocketAddr,
}

/// Where a connection to a backend goes, and for whom: the key it is kept idle under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Destination {
    pub(crate) backend: SocketAddr,
    /// For an app that asks for the PROXY protocol, what the connection announced: one that
    /// named a client is that client connection's own, never taken for another's requests
    /// (as HAProxy keeps such connections private).
    pub(crate) announced: Option<Announced>,
}

/// What a connection to a backend announced when it opened: the version and, for a
/// client's, whose connection it carries (a router's own when `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Announced {
    pub(crate) version: ProxyProtocol,
    pub(crate) ends: Option<ClientEnds>,
}

impl Announced {
    /// The header that opens the connection.
    pub(crate) fn header(&self) -> Vec<u8> {
        let addresses = self.ends.map(|ends| one_family(ends.client, ends.reached));
        match (self.version, addresses) {
            (ProxyProtocol::V1, Some(pair)) => ppp::v1::Addresses::from(pair).to_string(),
            (ProxyProtocol::V1, None) => ppp::v1::Addresses::Unknown.to_string(),
            (ProxyProtocol::V2, pair) => return v2_header(pair),
        }
        .into_bytes()
    }
}

fn v2_header(pair: Option<(SocketAddr, SocketAddr)>) -> Vec<u8> {
    let (command, addresses) = match pair {
        Some(pair) => (v2::Command::Proxy, v2::Addresses::from(pair)),
        None => (v2::Command::Local, v2::Addresses::Unspecified),
    };
    let protocol = match addresses {
        v2::Addresses::Unspecified => v2::Protocol::Unspecified,
        _ => v2::Protocol::Stream,
    };
    v2::Builder::with_addresses(v2::Version::Two | command, protocol, addresses)
        .build()
        // Only a payload over 64 KiB fails to build, and addresses are at most 36 bytes.
        .unwrap_or_else(|_| LOCAL_V2.to_vec())
}

/// Version 2's "local" header: signature, version 2 + LOCAL, unspecified family, no payload.
const LOCAL_V2: [u8; 16] = [
    0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a, 0x20, 0x00, 0x00, 0x00,
];

/// The two addresses in one family, as the header carries them: a client of a dual-stack
/// listener that came over IPv4 is written as IPv4 (`::ffff:a.b.c.d` → `a.b.c.d`), and a
/// pair still mixed after that as IPv6.
fn one_family(client: SocketAddr, reached: SocketAddr) -> (SocketAddr, SocketAddr) {
    let canonical = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
    let (client, reached) = (canonical(client), canonical(reached));
    if client.is_ipv4() == reached.is_ipv4() {
        return (client, reached);
    }
    let as_v6 = |a: SocketAddr| match a.ip() {
        IpAddr::V4(v4) => SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), a.port()),
        IpAddr::V6(_) => a,
    };
    (as_v6(client), as_v6(reached))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ends(client: &str, reached: &str) -> Option<ClientEnds> {
        Some(ClientEnds {
            client: client.parse().expect("an address"),
            reached: reached.parse().expect("an address"),
        })
    }

    #[test]
    fn version_1_names_the_client_and_the_address_it_reached() {
        let announced = Announced {
            version: ProxyProtocol::V1,
            ends: ends("203.0.113.7:51000", "192.0.2.1:443"),
        };
        assert_eq!(
            announced.header(),
            b"PROXY TCP4 203.0.113.7 192.0.2.1 51000 443\r\n"
        );
        let dual_stack = Announced {
            version: ProxyProtocol::V1,
            ends: ends("[::ffff:203.0.113.7]:51000", "[::ffff:192.0.2.1]:80"),
        };
        assert_eq!(
            dual_stack.header(),
            b"PROXY TCP4 203.0.113.7 192.0.2.1 51000 80\r\n"
        );
        let own = Announced {
            version: ProxyProtocol::V1,
            ends: None,
        };
        assert_eq!(own.header(), b"PROXY UNKNOWN\r\n");
    }

    #[test]
    fn version_2_is_the_binary_header_a_parser_reads_back() {
        let announced = Announced {
            version: ProxyProtocol::V2,
            ends: ends("[2001:db8::7]:51000", "203.0.113.1:443"),
        };
        let bytes = announced.header();
        let header = v2::Header::try_from(bytes.as_slice()).expect("a version 2 header");
        assert_eq!(header.command, v2::Command::Proxy);
        assert_eq!(header.protocol, v2::Protocol::Stream);
        let v2::Addresses::IPv6(pair) = header.addresses else {
            panic!("mixed families are written as IPv6: {:?}", header.addresses);
        };
        assert_eq!(
            pair.source_address,
            "2001:db8::7"
                .parse::<std::net::Ipv6Addr>()
                .expect("an address")
        );
        assert_eq!(
            pair.destination_address,
            "::ffff:203.0.113.1"
                .parse::<std::net::Ipv6Addr>()
                .expect("an address")
        );
        assert_eq!((pair.source_port, pair.destination_port), (51000, 443));
    }

    #[test]
    fn the_routers_own_connections_say_local() {
        let own = Announced {
            version: ProxyProtocol::V2,
            ends: None,
        };
        assert_eq!(own.header(), LOCAL_V2);
        let header = v2::Header::try_from(LOCAL_V2.as_slice()).expect("a version 2 header");
        assert_eq!(header.command, v2::Command::Local);
        assert_eq!(header.addresses, v2::Addresses::Unspecified);
    }
}
