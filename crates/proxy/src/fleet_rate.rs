//! App rates counted across the fleet (`"scope": "fleet"`): each router decides locally,
//! from what it admitted itself and what the fleet had admitted at its last sync, and syncs
//! with the store's Redis every `--limit-sync-ms` in one pipelined round trip for all such
//! apps. The counter is a sliding window over one-second windows (Cloudflare's estimate:
//! the previous window's count weighted by how much of it still overlaps, plus the current
//! window's), kept in Redis as `switchyard:limit:{app}:{second}` for a few seconds.
//!
//! A router's admissions reach Redis at its next sync, and the others read them at theirs;
//! each router also paces the rate with its own bucket, so what it admits unseen is at most
//! `rate × 2 × sync interval + burst`, and the fleet admits at most
//! `rate + (routers − 1) × (rate × 2 × sync interval + burst)` per second. When Redis is
//! away, each router goes on with what it knows (its own counts and the fleet's last ones,
//! then its own alone): a limit never turns a Redis outage into errors; the outage is
//! counted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use switchyard_store::{RedisLink, RedisTimeouts};

use crate::metrics;
use crate::wall_clock::unix_ms;

/// Prefix of the fleet's window counters in the store's Redis.
const KEY_PREFIX: &str = "switchyard:limit:";
/// A window's counter outlives the next window, when it is read as the previous one.
const KEY_TTL_S: i64 = 3;
/// Longest a sync waits for Redis.
const SYNC_TIMEOUT: Duration = Duration::from_millis(250);
/// An app's fleet counters are dropped after this long without a request.
const IDLE_AFTER_S: u64 = 60;

/// The fleet-wide counters of this router.
pub(crate) struct FleetRates {
    link: RedisLink,
    apps: Mutex<HashMap<String, Arc<Mutex<Windows>>>>,
    /// Most apps counted at once; a new one past it is decided locally alone.
    capacity: usize,
    synced: AtomicBool,
}

/// One app's view of the fleet's count.
#[derive(Debug, Default)]
struct Windows {
    /// The current window (seconds since the epoch).
    window: u64,
    /// The fleet's count of the previous window.
    previous: u64,
    /// The fleet's count of the current window at the last sync (this router's included).
    fleet: u64,
    /// Admitted here in the current window and not yet sent.
    pending: u64,
    /// Sent by the sync under way, not yet counted in `fleet`.
    sending: u64,
    /// Admitted here in the window before, not sent when it ended.
    unsent_previous: u64,
    last_used: u64,
}

impl Windows {
    fn roll(&mut self, window: u64) {
        if window == self.window {
            return;
        }
        let own_unsent = self.pending + self.sending;
        self.previous = if window == self.window + 1 {
            self.fleet + own_unsent
        } else {
            0
        };
        self.unsent_previous = if window == self.window + 1 {
            self.pending
        } else {
            0
        };
        self.window = window;
        self.fleet = 0;
        self.pending = 0;
        self.sending = 0;
    }
}

impl FleetRates {
    /// Counters shared through the Redis at `url` (the store's), for up to `capacity` apps.
    pub(crate) fn new(url: &str, capacity: usize) -> Result<Self, String> {
        let timeouts = RedisTimeouts {
            operation: SYNC_TIMEOUT,
            connect: SYNC_TIMEOUT,
            blocking: Duration::ZERO,
        };
        Ok(Self {
            link: RedisLink::new(url, "fleet limits", timeouts, 0)?,
            apps: Mutex::new(HashMap::new()),
            capacity,
            synced: AtomicBool::new(false),
        })
    }

    /// Admits one request of `app` within `per_s` across the fleet, or says how long until
    /// the window that may admit it.
    pub(crate) fn take(&self, app: &str, per_s: u32) -> Result<(), Duration> {
        let now = unix_ms();
        let (window, into) = (now / 1000, now % 1000);
        let Some(windows) = self.windows(app, now / 1000) else {
            return Ok(());
        };
        let mut w = windows.lock();
        w.roll(window);
        w.last_used = window;
        let overlap = w.previous * (1000 - into) / 1000;
        let estimate = overlap + w.fleet + w.sending + w.pending;
        if estimate >= u64::from(per_s) {
            return Err(Duration::from_millis(1000 - into));
        }
        w.pending += 1;
        Ok(())
    }

    fn windows(&self, app: &str, window: u64) -> Option<Arc<Mutex<Windows>>> {
        let mut apps = self.apps.lock();
        if let Some(windows) = apps.get(app) {
            return Some(windows.clone());
        }
        if apps.len() >= self.capacity {
            return None;
        }
        let windows = Arc::new(Mutex::new(Windows {
            window,
            last_used: window,
            ..Windows::default()
        }));
        apps.insert(app.to_string(), windows.clone());
        Some(windows)
    }

    /// Syncs every `interval` until `stop` resolves.
    pub(crate) async fn run(self: Arc<Self>, interval: Duration, stop: impl std::future::Future) {
        tokio::pin!(stop);
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = ticks.tick() => self.sync().await,
            }
        }
    }

    /// Sends what each app admitted here since the last sync and reads the fleet's counts
    /// back, all apps in one pipeline.
    async fn sync(&self) {
        let window = unix_ms() / 1000;
        let mut batch = Vec::new();
        {
            let mut apps = self.apps.lock();
            apps.retain(|_, windows| windows.lock().last_used + IDLE_AFTER_S > window);
            for (app, windows) in apps.iter() {
                let mut w = windows.lock();
                w.roll(window);
                let (pending, unsent) = (w.pending, w.unsent_previous);
                w.sending += pending;
                w.pending = 0;
                w.unsent_previous = 0;
                batch.push((app.clone(), windows.clone(), pending, unsent));
            }
        }
        if batch.is_empty() {
            return;
        }
        let mut pipe = redis::pipe();
        for (app, _, pending, unsent) in &batch {
            let current = format!("{KEY_PREFIX}{app}:{window}");
            let previous = format!("{KEY_PREFIX}{app}:{}", window - 1);
            pipe.incr(&current, *pending).expire(&current, KEY_TTL_S);
            if *unsent > 0 {
                pipe.incr(&previous, *unsent).ignore();
                pipe.expire(&previous, KEY_TTL_S).ignore();
            }
            pipe.get(&previous);
        }
        let answer: Result<Vec<(u64, i64, Option<u64>)>, _> = self
            .link
            .call(|mut c| async move {
                let flat: Vec<redis::Value> = pipe.query_async(&mut c).await?;
                Ok(flat)
            })
            .await
            .map(|flat| triples(&flat));
        match answer {
            Ok(counts) if counts.len() == batch.len() => {
                for ((_, windows, sent, _), (fleet, _, previous)) in batch.iter().zip(counts) {
                    let mut w = windows.lock();
                    if w.window == window {
                        w.sending = w.sending.saturating_sub(*sent);
                        w.fleet = fleet;
                        w.previous = w.previous.max(previous.unwrap_or(0));
                    }
                }
                self.synced.store(true, Ordering::Relaxed);
                metrics::LIMIT_FLEET_SYNCED.set(1);
            }
            other => {
                if let Err(e) = other {
                    log::debug!("fleet limits: sync failed: {e}");
                }
                // Kept locally, and sent again with the next sync: the sent counts go on
                // counting here as admitted, and the previous window's unsent ones wait
                // too. Dropped, they would be admissions the fleet never hears of (one
                // failed sync at each second's turn lost a whole window under load).
                for (_, windows, sent, unsent) in &batch {
                    let mut w = windows.lock();
                    if w.window == window {
                        w.sending = w.sending.saturating_sub(*sent);
                        w.pending += sent;
                        w.unsent_previous += unsent;
                    } else if w.window == window + 1 {
                        // The window ended while the sync was away: its counts are the
                        // previous window's now (those of the one before no longer count).
                        w.unsent_previous += sent;
                    }
                }
                if self.synced.swap(false, Ordering::Relaxed) {
                    log::warn!("fleet limits: Redis is away; each router limits on its own counts");
                }
                metrics::LIMIT_FLEET_SYNCED.set(0);
                metrics::LIMIT_FLEET_SYNC_FAILURES.inc();
            }
        }
    }
}

/// The pipeline's answers, three per app: INCRBY, EXPIRE, GET (the ignored ones left out).
fn triples(flat: &[redis::Value]) -> Vec<(u64, i64, Option<u64>)> {
    flat.chunks(3)
        .filter_map(|chunk| match chunk {
            [count, expire, previous] => Some((
                redis::from_redis_value::<u64>(count).ok()?,
                redis::from_redis_value::<i64>(expire).unwrap_or(0),
                redis::from_redis_value::<Option<u64>>(previous).ok()?,
            )),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_roll_carries_the_count_into_the_previous_window() {
        let mut w = Windows {
            window: 10,
            fleet: 40,
            pending: 5,
            sending: 3,
            ..Windows::default()
        };
        w.roll(11);
        assert_eq!((w.previous, w.fleet, w.pending, w.sending), (48, 0, 0, 0));
        assert_eq!(
            w.unsent_previous, 5,
            "what was never sent goes with the next sync"
        );
        w.roll(13);
        assert_eq!((w.previous, w.unsent_previous), (0, 0), "a gap forgets");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_sync_keeps_the_counts_it_carried_for_the_next_one() {
        // Nothing listens on port 1: every sync fails at once.
        let rates = FleetRates::new("redis://127.0.0.1:1/0", 10).expect("a valid url");
        for _ in 0..3 {
            let window = unix_ms() / 1000;
            rates.apps.lock().insert(
                "app".into(),
                Arc::new(Mutex::new(Windows {
                    window,
                    last_used: window,
                    pending: 5,
                    unsent_previous: 3,
                    ..Windows::default()
                })),
            );
            rates.sync().await;
            let windows = rates.apps.lock()["app"].clone();
            let w = windows.lock();
            if w.window != window || unix_ms() / 1000 != window {
                continue; // a second's turn came in the middle: try again within one
            }
            assert_eq!((w.pending, w.sending, w.unsent_previous), (5, 0, 3));
            return;
        }
        panic!("three tries each crossed a second's turn");
    }
}
