//! The tokens of sticky sessions (`stage::affinity`): the fleet's key, and each app's
//! backends' tokens both ways, kept with the app's route.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::OnceLock;

use http::HeaderValue;
use openssl::pkey::PKey;
use openssl::sign::Signer;

/// The fleet's key, once the store gave it (`set_key`).
static KEY: OnceLock<[u8; 32]> = OnceLock::new();

/// Takes the fleet's affinity secret (as the store keeps it); until then apps with
/// affinity are balanced as others and set no cookie. False when a key was set already.
pub fn set_key(secret: &str) -> bool {
    KEY.set(openssl::sha::sha256(secret.as_bytes())).is_ok()
}

/// The fleet's key, once it came.
pub(crate) fn key() -> Option<&'static [u8; 32]> {
    KEY.get()
}

/// An app's backends' tokens, both ways.
#[derive(Debug, Default)]
pub(crate) struct Tokens {
    by_token: HashMap<String, SocketAddr>,
    /// Each backend's whole `Set-Cookie` value, over clear HTTP and over TLS (`Secure`),
    /// made once: formatting it for each answer that sets it cost more than the stage's
    /// own work.
    cookies: HashMap<SocketAddr, [Option<HeaderValue>; 2]>,
}

impl Tokens {
    /// The tokens of `backends` of app `app` under `key`, with the cookie `cookie` makes of
    /// each token, over clear HTTP (false) and over TLS (true).
    pub(crate) fn of(
        app: &str,
        backends: impl Iterator<Item = SocketAddr>,
        key: &[u8; 32],
        cookie: impl Fn(&str, bool) -> Option<HeaderValue>,
    ) -> Self {
        let mut tokens = Self::default();
        for address in backends {
            if let Some(token) = token(key, app, address) {
                let cookies = [cookie(&token, false), cookie(&token, true)];
                tokens.by_token.insert(token, address);
                tokens.cookies.insert(address, cookies);
            }
        }
        tokens
    }

    /// The backend a token names, if it is one of the app's.
    pub(crate) fn backend(&self, token: &str) -> Option<SocketAddr> {
        self.by_token.get(token).copied()
    }

    /// The token of one of the app's backends.
    #[cfg(test)]
    pub(crate) fn token(&self, address: SocketAddr) -> Option<&str> {
        let mut tokens = self.by_token.iter();
        tokens.find_map(|(token, named)| (*named == address).then_some(token.as_str()))
    }

    /// The `Set-Cookie` value for one of the app's backends, over TLS or not.
    pub(crate) fn cookie(&self, address: SocketAddr, tls: bool) -> Option<&HeaderValue> {
        self.cookies.get(&address)?[usize::from(tls)].as_ref()
    }
}

/// The token of `address` in app `app`: base64 of 16 bytes of HMAC-SHA256.
fn token(key: &[u8; 32], app: &str, address: SocketAddr) -> Option<String> {
    let key = PKey::hmac(key).ok()?;
    let mut signer = Signer::new(openssl::hash::MessageDigest::sha256(), &key).ok()?;
    signer.update(app.as_bytes()).ok()?;
    signer.update(b"\0").ok()?;
    signer.update(address.to_string().as_bytes()).ok()?;
    let mac = signer.sign_to_vec().ok()?;
    Some(openssl::base64::encode_block(&mac[..16]))
}

/// What a request's sticky-session cookie says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sticky {
    /// One of the app's backends.
    Named(SocketAddr),
    /// No backend of the app.
    Gone,
}

impl Sticky {
    /// The backend to try first.
    pub(crate) fn backend(&self) -> Option<SocketAddr> {
        match self {
            Self::Named(backend) => Some(*backend),
            Self::Gone => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_opaque_stable_and_per_app() {
        let key = [7u8; 32];
        let address: SocketAddr = "10.0.0.5:8080".parse().expect("address");
        let token_a = token(&key, "shop", address).expect("token");
        assert_eq!(
            token(&key, "shop", address),
            Some(token_a.clone()),
            "stable"
        );
        assert_ne!(
            token(&key, "blog", address),
            Some(token_a.clone()),
            "per app"
        );
        assert_ne!(
            token(&[8u8; 32], "shop", address),
            Some(token_a.clone()),
            "per key"
        );
        assert!(!token_a.contains("10.0.0.5"));
        assert_eq!(token_a.len(), 24);
    }
}
