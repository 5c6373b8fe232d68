//! The wall clock, for times shown to people and shared with other processes (the fleet's
//! rate windows in Redis, when a change was applied, when a name last resolved). Durations
//! measured inside this process use `Instant` instead: it never jumps.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 on a clock set before it).
pub(crate) fn unix_ms() -> u64 {
    unix_ms_of(SystemTime::now())
}

/// Milliseconds from the Unix epoch to `at` (0 for a time before it).
pub(crate) fn unix_ms_of(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Seconds since the Unix epoch (0 on a clock set before it).
pub(crate) fn unix_s() -> u64 {
    unix_ms() / 1000
}
