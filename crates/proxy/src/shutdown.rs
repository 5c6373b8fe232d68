//! The signal that the router is stopping, as the background tasks watch it.

/// Changes to `true` once, when the router stops accepting; background tasks end then.
pub type ShutdownWatch = tokio::sync::watch::Receiver<bool>;
