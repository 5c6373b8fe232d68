//! The client end of a connection, as each of its requests needs it: its address and the
//! router's it reached, whether it is closing, and its pacing after a refusal
//! (`crate::isolation`).

use std::cell::Cell;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;

use http::HeaderValue;
use switchyard_model::ProxyProtocol;

use crate::isolation::Pacing;
use crate::proxy_protocol::{Announced, ClientEnds};
use crate::stage::basic_auth::PassedOnConnection;
use crate::stage::waf::Endpoints;

/// The client end of a connection, as each of its requests needs it.
pub(crate) struct Client {
    ip: IpAddr,
    port: u16,
    /// The router's address the client connected to.
    reached: SocketAddr,
    pub(super) tls: bool,
    /// `X-Forwarded-For` for a request that brings none: the address, formatted once per
    /// connection rather than per request.
    pub(super) forwarded_for: Option<HeaderValue>,
    /// The router is stopping: answers close the connection after them.
    closing: Cell<bool>,
    /// The wait before its next request, after a refusal with `Retry-After`.
    pub(super) pacing: Pacing,
    /// The credentials that last passed on it, for an app with a password.
    pub(super) passwords: PassedOnConnection,
}

impl Client {
    pub(crate) fn new(peer: SocketAddr, reached: SocketAddr, tls: bool) -> Rc<Self> {
        Rc::new(Self {
            ip: peer.ip(),
            port: peer.port(),
            reached,
            tls,
            forwarded_for: HeaderValue::try_from(peer.ip().to_string()).ok(),
            closing: Cell::new(false),
            pacing: Pacing::default(),
            passwords: PassedOnConnection::default(),
        })
    }

    /// From now on, each answer closes the connection after it.
    pub(crate) fn close_after_answer(&self) {
        self.closing.set(true);
    }

    /// Whether answers close the connection after them (the router is stopping).
    pub(crate) fn closing(&self) -> bool {
        self.closing.get()
    }

    /// The port the client connected to.
    pub(crate) fn server_port(&self) -> u16 {
        self.reached.port()
    }

    /// What a PROXY protocol header of `version` announces for this client's requests.
    pub(crate) fn announced(&self, version: ProxyProtocol) -> Announced {
        let ends = ClientEnds {
            client: SocketAddr::new(self.ip, self.port),
            reached: self.reached,
        };
        Announced {
            version,
            ends: Some(ends),
        }
    }

    pub(crate) fn ip(&self) -> IpAddr {
        self.ip
    }

    pub(super) fn endpoints(&self) -> Endpoints {
        Endpoints {
            client: Some(SocketAddr::new(self.ip, self.port)),
            server_port: self.reached.port(),
        }
    }
}
