//! Where the response cache keeps its copies: in this process's memory (bounded over all
//! apps), or in the cache Redis a fleet shares (including the app-written versioned layout).
//! The decisions — what is kept, for how long, what answers — are the `cache` stage's.

pub(crate) mod memory;
pub(crate) mod redis;
