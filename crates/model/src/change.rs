use serde::{Deserialize, Serialize};

/// What changed in the store, naming exactly the cache entries to invalidate, so that the
/// cost of a change does not depend on how many apps exist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Change {
    /// An app was created, updated or deleted. `domains` holds every domain it had before
    /// or has after the change, so both old and new routes are invalidated.
    App {
        /// The app's name.
        name: String,
        /// Domains whose routing may have changed (left out of the JSON when none).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        domains: Vec<String>,
    },
    /// The certificate stored under `domain` (exact or `*.` wildcard) was put or deleted.
    Cert {
        /// The domain as stored.
        domain: String,
    },
    /// Cached responses of `app` under `path` (every query string of it; with `prefix`,
    /// every path starting with it) must be dropped. Not a stored change: it only travels.
    CachePurge {
        /// The app's name.
        app: String,
        /// An absolute path.
        path: String,
        /// Whether `path` is a prefix.
        prefix: bool,
    },
    /// The WAF's rule files were loaded again on one router (its admin API's reload): every
    /// router sharing the store loads its own again, so a fleet inspects with the same
    /// rules. Not a stored change: it only travels.
    WafReload {
        /// Which reload this is: the router that made it has loaded already, and one that
        /// hears it twice (its own announcement, a resubscription) loads once.
        reload: u64,
    },
    /// The stored module named `name` (a proxy-wasm filter) was put or deleted: every
    /// router loads it again, and rebuilds the routes of the apps that run it.
    Filter {
        /// The filter's name.
        name: String,
    },
    /// Changes may have been missed (a lagging subscriber, a reconnect): every cached entry
    /// must be revalidated against the store.
    Resync,
}
