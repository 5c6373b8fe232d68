use thiserror::Error;

/// Why a store operation failed.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The app named does not exist.
    #[error("app '{0}' does not exist")]
    AppNotFound(String),
    /// A domain of the app being written already belongs to another app.
    #[error("domain '{domain}' already belongs to app '{owner}'")]
    DomainTaken {
        /// The contested domain.
        domain: String,
        /// Its current owner.
        owner: String,
    },
    /// An `If-Match` precondition failed: the app or certificate changed since the caller
    /// read it (or is gone). Nothing was written.
    #[error("'{0}' changed since it was read: its ETag no longer matches If-Match")]
    PreconditionFailed(String),
    /// The write is on the Redis primary but fewer replicas than asked for hold it: a
    /// failover now could lose it.
    #[error("the write is on the Redis primary but not yet safe from a failover: {0}")]
    NotDurable(String),
    /// The store could not be read or written; callers treat it as temporary.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Stored data could not be decoded: a bug or a hand-edited store.
    #[error("corrupt record for '{key}': {reason}")]
    Corrupt {
        /// Key of the unreadable record.
        key: String,
        /// Decoder's complaint.
        reason: String,
    },
}
