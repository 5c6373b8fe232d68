//! Session-ticket keys for TLS resumption that rotate while the server runs.
//!
//! OpenSSL encrypts session tickets with one key per `SSL_CTX`, made at start-up and kept for
//! the life of the process: a key stolen from a long-running router would decrypt every
//! session it ever issued. Here tickets are sealed with the newest of a small ring of keys;
//! older keys still open tickets (the client resumes and gets a fresh ticket under the new
//! key) until they fall off the ring. Rotating every `interval` and keeping two keys bounds a
//! ticket's usefulness — and a stolen key's reach — to two intervals.
//!
//! The openssl crate does not wrap the ticket-key callback, so this crate holds the one
//! `unsafe` FFI callback of the project, kept small and in one place.

use std::sync::{Arc, OnceLock};

use openssl::error::ErrorStack;
use openssl::ssl::SslContextBuilder;
use parking_lot::RwLock;

mod callback;

const NAME_LEN: usize = 16;
const AES_KEY_LEN: usize = 32;
const HMAC_KEY_LEN: usize = 32;

/// One ticket key: a public name (sent in the ticket, to find the key again) and secrets.
#[derive(Clone)]
struct TicketKey {
    name: [u8; NAME_LEN],
    aes: [u8; AES_KEY_LEN],
    hmac: [u8; HMAC_KEY_LEN],
}

impl TicketKey {
    fn random() -> Result<Self, ErrorStack> {
        let mut key = Self {
            name: [0; NAME_LEN],
            aes: [0; AES_KEY_LEN],
            hmac: [0; HMAC_KEY_LEN],
        };
        openssl::rand::rand_bytes(&mut key.name)?;
        openssl::rand::rand_bytes(&mut key.aes)?;
        openssl::rand::rand_bytes(&mut key.hmac)?;
        Ok(key)
    }
}

/// The ring of ticket keys, newest first.
pub struct TicketKeys {
    ring: RwLock<Vec<TicketKey>>,
    keep: usize,
}

impl TicketKeys {
    /// A ring holding at most `keep` keys (at least 1), starting with one fresh key.
    pub fn new(keep: usize) -> Result<Arc<Self>, ErrorStack> {
        Ok(Arc::new(Self {
            ring: RwLock::new(vec![TicketKey::random()?]),
            keep: keep.max(1),
        }))
    }

    /// Makes a fresh key the one new tickets are sealed with and forgets the oldest beyond
    /// the ring's size: tickets sealed with it no longer resume.
    pub fn rotate(&self) -> Result<(), ErrorStack> {
        let fresh = TicketKey::random()?;
        let mut ring = self.ring.write();
        ring.insert(0, fresh);
        ring.truncate(self.keep);
        Ok(())
    }

    /// How many keys can currently open a ticket.
    pub fn len(&self) -> usize {
        self.ring.read().len()
    }

    /// Never true: a ring always holds its current key.
    pub fn is_empty(&self) -> bool {
        self.ring.read().is_empty()
    }

    fn current(&self) -> Option<TicketKey> {
        self.ring.read().first().cloned()
    }

    /// The key named `name`, and whether it is the current one.
    fn find(&self, name: &[u8]) -> Option<(TicketKey, bool)> {
        let ring = self.ring.read();
        ring.iter()
            .position(|k| k.name == name)
            .map(|i| (ring[i].clone(), i == 0))
    }
}

/// Why the keys could not be installed.
#[derive(Debug)]
pub enum InstallError {
    /// Another ring is already installed in this process; the callback has no per-context
    /// argument, so one process serves one ring.
    AnotherRingInstalled,
    /// OpenSSL refused the callback.
    Refused,
}

impl std::fmt::Display for InstallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AnotherRingInstalled => f.write_str("another ticket-key ring is installed"),
            Self::Refused => f.write_str("OpenSSL refused the session-ticket callback"),
        }
    }
}

impl std::error::Error for InstallError {}

static INSTALLED: OnceLock<Arc<TicketKeys>> = OnceLock::new();

/// Makes `context` seal and open session tickets with `keys`.
pub fn install(context: &mut SslContextBuilder, keys: Arc<TicketKeys>) -> Result<(), InstallError> {
    let installed = INSTALLED.get_or_init(|| keys.clone());
    if !Arc::ptr_eq(installed, &keys) {
        return Err(InstallError::AnotherRingInstalled);
    }
    if callback::set_on(context) {
        Ok(())
    } else {
        Err(InstallError::Refused)
    }
}

fn installed_keys() -> Option<&'static Arc<TicketKeys>> {
    INSTALLED.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_keeps_a_bounded_ring_newest_first() {
        let keys = TicketKeys::new(2).expect("keys");
        let first = keys.current().expect("a key").name;
        keys.rotate().expect("rotate");
        let second = keys.current().expect("a key").name;
        assert_ne!(first, second);
        assert_eq!(keys.find(&first).map(|(_, current)| current), Some(false));
        assert_eq!(keys.find(&second).map(|(_, current)| current), Some(true));
        keys.rotate().expect("rotate");
        assert_eq!(keys.len(), 2);
        assert!(keys.find(&first).is_none(), "the oldest key is forgotten");
    }
}
