//! The response cache's Redis (`--cache-redis`), kept apart from the route store: a cache
//! Redis runs with `maxmemory` and `allkeys-lru`, which must never evict routes.
//!
//! Two layouts live there. `redis`: responses the routers store themselves, shared by the
//! fleet, under `switchyard:cache:{app}:{url}`, kept until no router may serve or revalidate them.
//! `redis-versioned`: the versioned layout, written by the app, only read here.
//!
//! Every call has a short deadline, and any error or timeout is a cache miss: the app
//! answers instead, never a 5xx. Writes leave the request path at once and are bounded in
//! number; beyond the bound they are dropped and counted.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use redis::AsyncCommands;
use switchyard_store::{LinkError, RedisLink, RedisTimeouts};

use crate::metrics;
use crate::response_cache::memory::{CachedResponse, Entry};
use crate::wall_clock::unix_ms_of;

/// The hash of the versioned layout holding each URL's current version.
const VERSIONS_HASH: &str = "resource_versions";
/// Prefix of the keys of the shared (`redis`) store.
const SHARED_PREFIX: &str = "switchyard:cache:";
/// Writes to the cache Redis in flight at once; more are dropped.
const MAX_WRITES_IN_FLIGHT: usize = 256;
/// Keys asked per `SCAN` step of a purge.
const PURGE_SCAN_COUNT: usize = 1000;
/// Longest a purge may scan; a larger keyspace is purged in part and the caller told.
const PURGE_DEADLINE: Duration = Duration::from_secs(10);
/// First bytes of a stored value: the format, so a later one can tell old entries apart.
/// (Format 1 lacked the keep time and the variants' generation: its entries read as misses.)
const FORMAT_RESPONSE: &[u8] = b"SYC2R";
const FORMAT_VARIES: &[u8] = b"SYC2V";

/// A lazily connected client of the cache Redis.
pub struct CacheRedis {
    link: RedisLink,
    writes_in_flight: Arc<AtomicUsize>,
}

/// What a purge removed.
#[derive(Debug, Clone, Copy)]
pub struct PurgeReport {
    /// Keys deleted.
    pub deleted: u64,
    /// False when the deadline cut the scan short.
    pub complete: bool,
}

impl CacheRedis {
    /// A client for `url` (`redis://` or `rediss://`) whose calls give up after `timeout`.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, String> {
        let timeouts = RedisTimeouts {
            operation: timeout,
            connect: timeout,
            blocking: Duration::ZERO,
        };
        let link = RedisLink::new(url, "response cache", timeouts, 0)
            .map_err(|e| format!("cache Redis: {e}"))?;
        Ok(Self {
            link,
            writes_in_flight: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// Runs a read; any failure is counted and becomes `None` (a miss).
    async fn read<T, F, Fut>(&self, op: F) -> Option<T>
    where
        F: FnOnce(redis::aio::ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        self.link.call(op).await.map_err(count_error).ok()
    }

    /// The body stored for `full_url` at its current version, as the versioned layout keeps it: `HGET
    /// resource_versions FULL_URL`, then `GET FULL_URL:version=N`. `None` on a miss, an
    /// empty body, or any error.
    pub(crate) async fn versioned_body(&self, full_url: &str) -> Option<Bytes> {
        let version: String = self
            .read(|mut c| async move {
                c.hget::<_, _, Option<String>>(VERSIONS_HASH, full_url)
                    .await
            })
            .await??;
        let key = format!("{full_url}:version={}", version.trim());
        let body: Vec<u8> = self
            .read(|mut c| async move { c.get::<_, Option<Vec<u8>>>(key).await })
            .await??;
        (!body.is_empty()).then(|| Bytes::from(body))
    }

    /// What the shared store holds for `key` of `app`; `None` on a miss, an unreadable value
    /// or any error.
    pub(crate) async fn shared_entry(&self, app: &str, key: &str) -> Option<Entry> {
        let redis_key = shared_key(app, key);
        let value: Vec<u8> = self
            .read(|mut c| async move { c.get::<_, Option<Vec<u8>>>(redis_key).await })
            .await??;
        decode(&value, SystemTime::now(), Instant::now())
    }

    /// Stores `entries` of `app` in the background; `done` is dropped when the write ends,
    /// so requests waiting for this fill look again only once it can be read. Dropped (and
    /// counted) when too many writes are already in flight.
    pub(crate) fn store_shared<T: Send + 'static>(
        self: &Arc<Self>,
        app: &str,
        entries: Vec<(String, Entry)>,
        done: T,
    ) {
        if !self.reserve_write() {
            return;
        }
        let (now, monotonic_now) = (SystemTime::now(), Instant::now());
        let encoded: Vec<(&String, Vec<u8>, Option<Duration>)> = entries
            .iter()
            .filter_map(|(key, entry)| {
                let (value, ttl) = encode(entry, now, monotonic_now)?;
                Some((key, value, ttl))
            })
            .collect();
        // A Varies marker lives as long as the variant written with it.
        let longest = encoded.iter().filter_map(|(_, _, ttl)| *ttl).max();
        let mut pipe = redis::pipe();
        for (key, value, ttl) in encoded {
            let Some(ttl) = ttl.or(longest) else {
                continue;
            };
            pipe.cmd("SET")
                .arg(shared_key(app, key))
                .arg(value)
                .arg("PX")
                .arg(ttl.as_millis().max(1) as u64)
                .ignore();
        }
        let this = self.clone();
        tokio::spawn(async move {
            let written = this
                .link
                .call(|mut c| async move { pipe.query_async::<()>(&mut c).await })
                .await;
            this.write_ended(written, "stored");
            drop(done);
        });
    }

    /// Deletes what `app` stores under `keys` (URLs: a response, or the `Varies` entry that
    /// leads to the variants), in the background as writes are. Every router reads the
    /// shared store, so the whole fleet stops serving them at once.
    pub(crate) fn invalidate_shared(self: &Arc<Self>, app: &str, keys: Vec<String>) {
        if !self.reserve_write() {
            return;
        }
        let doomed: Vec<String> = keys.iter().map(|key| shared_key(app, key)).collect();
        let this = self.clone();
        tokio::spawn(async move {
            let deleted = this
                .link
                .call(|mut c| async move { c.del::<_, ()>(doomed).await })
                .await;
            this.write_ended(deleted, "invalidated");
        });
    }

    /// Takes a place among the writes in flight; false (counted as shed) when they are all
    /// taken.
    fn reserve_write(&self) -> bool {
        let in_flight = self.writes_in_flight.fetch_add(1, Ordering::AcqRel);
        if in_flight >= MAX_WRITES_IN_FLIGHT {
            self.writes_in_flight.fetch_sub(1, Ordering::AcqRel);
            metrics::CACHE_REDIS_WRITES
                .with_label_values(&["shed"])
                .inc();
            return false;
        }
        true
    }

    /// Counts a write that ended (as `done` when it succeeded) and gives its place back.
    fn write_ended(&self, result: Result<(), LinkError>, done: &'static str) {
        let label = match result {
            Ok(()) => done,
            Err(e) => {
                count_error(e);
                "failed"
            }
        };
        metrics::CACHE_REDIS_WRITES
            .with_label_values(&[label])
            .inc();
        self.writes_in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// Deletes the shared responses of `app` stored for `path` (any scheme, host, query or
    /// variant), or under it with `prefix`, scanning the app's keys.
    pub async fn purge_shared(
        &self,
        app: &str,
        path: &str,
        prefix: bool,
    ) -> Result<PurgeReport, LinkError> {
        let app_prefix = shared_key(app, "");
        let pattern = format!("{}*", glob_escape(&app_prefix));
        let started = Instant::now();
        let mut cursor: u64 = 0;
        let mut deleted = 0;
        loop {
            let pattern = pattern.clone();
            let (next, keys): (u64, Vec<String>) = self
                .link
                .call(|mut c| async move {
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("COUNT")
                        .arg(PURGE_SCAN_COUNT)
                        .query_async(&mut c)
                        .await
                })
                .await?;
            let doomed: Vec<String> = keys
                .into_iter()
                .filter(|key| {
                    let stored_path =
                        crate::response_cache::memory::key_path(&key[app_prefix.len()..]);
                    if prefix {
                        stored_path.starts_with(path)
                    } else {
                        stored_path == path
                    }
                })
                .collect();
            if !doomed.is_empty() {
                let removed: u64 = self
                    .link
                    .call(|mut c| async move { c.del(doomed).await })
                    .await?;
                deleted += removed;
            }
            cursor = next;
            if cursor == 0 {
                return Ok(PurgeReport {
                    deleted,
                    complete: true,
                });
            }
            if started.elapsed() > PURGE_DEADLINE {
                return Ok(PurgeReport {
                    deleted,
                    complete: false,
                });
            }
        }
    }
}

fn count_error(error: LinkError) -> LinkError {
    if let Some(kind) = error.kind() {
        metrics::CACHE_REDIS_ERRORS.with_label_values(&[kind]).inc();
    }
    error
}

fn shared_key(app: &str, key: &str) -> String {
    format!("{SHARED_PREFIX}{app}:{key}")
}

/// Escapes what `SCAN MATCH` would read as a pattern (app names cannot hold it today; the
/// key layout should not depend on that).
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// The stored form of an entry and, for a response, how long Redis should keep it (until
/// it is no longer kept for revalidation nor for standing in); `None` when the response has
/// already expired. Times travel as Unix milliseconds, since another router reads them.
///
/// Response: `SYC2R`, status (u16), age-counts-from, fresh-until, stale-until,
/// revalidating-until and keep-until (u64 ms each), the lifetime (u64 ms), what decided it (u8 length, text), the header count
/// (u16), each header as name length (u16), name, value length (u32), value, then the body
/// to the end. Varies: `SYC2V`, the generation (u64),
/// and the header names joined by `\n`.
fn encode(
    entry: &Entry,
    now: SystemTime,
    monotonic_now: Instant,
) -> Option<(Vec<u8>, Option<Duration>)> {
    let wall = |at: Instant| -> u64 {
        let wall = match at.checked_duration_since(monotonic_now) {
            Some(ahead) => now + ahead,
            None => now - monotonic_now.duration_since(at),
        };
        unix_ms_of(wall)
    };
    match entry {
        Entry::Response(response) => {
            let ttl = response
                .keep_until
                .checked_duration_since(monotonic_now)
                .filter(|left| !left.is_zero())?;
            let mut value = Vec::with_capacity(
                FORMAT_RESPONSE.len() + 40 + response.body.len() + 64 * response.headers.len(),
            );
            value.extend_from_slice(FORMAT_RESPONSE);
            value.extend_from_slice(&response.status.to_be_bytes());
            for at in [
                response.age_counts_from,
                response.fresh_until,
                response.stale_until,
                response.revalidating_until,
                response.keep_until,
            ] {
                value.extend_from_slice(&wall(at).to_be_bytes());
            }
            let lifetime_ms = u64::try_from(response.lifetime.as_millis()).unwrap_or(u64::MAX);
            value.extend_from_slice(&lifetime_ms.to_be_bytes());
            let decided_by = response.decided_by.as_bytes();
            value.push(u8::try_from(decided_by.len()).ok()?);
            value.extend_from_slice(decided_by);
            value.extend_from_slice(&u16::try_from(response.headers.len()).ok()?.to_be_bytes());
            for (name, header_value) in &response.headers {
                value.extend_from_slice(&u16::try_from(name.as_str().len()).ok()?.to_be_bytes());
                value.extend_from_slice(name.as_str().as_bytes());
                value.extend_from_slice(&u32::try_from(header_value.len()).ok()?.to_be_bytes());
                value.extend_from_slice(header_value.as_bytes());
            }
            value.extend_from_slice(&response.body);
            Some((value, Some(ttl)))
        }
        Entry::Varies { names, generation } => {
            let mut value = FORMAT_VARIES.to_vec();
            value.extend_from_slice(&generation.to_be_bytes());
            let joined: Vec<&str> = names.iter().map(HeaderName::as_str).collect();
            value.extend_from_slice(joined.join("\n").as_bytes());
            Some((value, None))
        }
    }
}

/// Reads back what [`encode`] wrote, with times turned into this process's clock; `None` for
/// anything malformed (treated as a miss).
fn decode(value: &[u8], now: SystemTime, monotonic_now: Instant) -> Option<Entry> {
    if let Some(varies) = value.strip_prefix(FORMAT_VARIES) {
        let mut reader = Reader(varies);
        let generation = u64::from_be_bytes(reader.take_array()?);
        let names: Option<Vec<HeaderName>> = std::str::from_utf8(reader.0)
            .ok()?
            .split('\n')
            .map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
            .collect();
        return Some(Entry::Varies {
            names: Arc::from(names?),
            generation,
        });
    }
    let mut reader = Reader(value.strip_prefix(FORMAT_RESPONSE)?);
    let status = u16::from_be_bytes(reader.take_array()?);
    let now_ms = unix_ms_of(now);
    let mut local = || -> Option<Instant> {
        let at = u64::from_be_bytes(reader.take_array()?);
        Some(if at >= now_ms {
            monotonic_now + Duration::from_millis(at - now_ms)
        } else {
            monotonic_now
                .checked_sub(Duration::from_millis(now_ms - at))
                .unwrap_or(monotonic_now)
        })
    };
    let (age_counts_from, fresh_until, stale_until, revalidating_until, keep_until) =
        (local()?, local()?, local()?, local()?, local()?);
    let lifetime = Duration::from_millis(u64::from_be_bytes(reader.take_array()?));
    let [decided_by_len] = reader.take_array()?;
    let decided_by = freshness_decider(reader.take(usize::from(decided_by_len))?);
    let count = u16::from_be_bytes(reader.take_array()?);
    let mut headers = HeaderMap::with_capacity(usize::from(count));
    for _ in 0..count {
        let name_len = u16::from_be_bytes(reader.take_array()?);
        let name = HeaderName::from_bytes(reader.take(usize::from(name_len))?).ok()?;
        let value_len = u32::from_be_bytes(reader.take_array()?);
        let value = HeaderValue::from_bytes(reader.take(value_len as usize)?).ok()?;
        headers.append(name, value);
    }
    Some(Entry::Response(Arc::new(CachedResponse {
        status,
        headers,
        body: Bytes::copy_from_slice(reader.0),
        age_counts_from,
        lifetime,
        decided_by,
        fresh_until,
        stale_until,
        revalidating_until,
        keep_until,
    })))
}

/// The field that decided a copy's freshness, as another router wrote it: one of the
/// cache's own names (it is shown, never trusted), or "unknown".
fn freshness_decider(written: &[u8]) -> &'static str {
    crate::response_cache::memory::FRESHNESS_DECIDERS
        .iter()
        .find(|name| name.as_bytes() == written)
        .copied()
        .unwrap_or("unknown")
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn take_array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_survive_the_trip_through_redis() {
        let (now, monotonic) = (SystemTime::now(), Instant::now());
        let response = CachedResponse {
            status: 203,
            headers: HeaderMap::from_iter([
                (
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("text/html"),
                ),
                (
                    HeaderName::from_static("x-binary"),
                    HeaderValue::from_bytes(b"\xfe\ta").expect("opaque value"),
                ),
            ]),
            body: Bytes::from_static(b"<h1>hello</h1>\x00\xff"),
            age_counts_from: monotonic - Duration::from_secs(5),
            lifetime: Duration::from_secs(60),
            decided_by: "Expires - Date",
            fresh_until: monotonic + Duration::from_secs(55),
            stale_until: monotonic + Duration::from_secs(355),
            revalidating_until: monotonic + Duration::from_secs(85),
            keep_until: monotonic + Duration::from_secs(3655),
        };
        let (value, ttl) =
            encode(&Entry::Response(Arc::new(response)), now, monotonic).expect("encodable");
        assert_eq!(ttl, Some(Duration::from_secs(3655)));
        // Read by another router a second later.
        let later = monotonic + Duration::from_secs(1);
        let Some(Entry::Response(back)) = decode(&value, now + Duration::from_secs(1), later)
        else {
            panic!("a response comes back");
        };
        assert_eq!(back.status, 203);
        assert_eq!(back.headers.len(), 2);
        assert_eq!(
            back.headers.get("x-binary").map(HeaderValue::as_bytes),
            Some(&b"\xfe\ta"[..])
        );
        assert_eq!(&back.body[..], b"<h1>hello</h1>\x00\xff");
        assert_eq!(
            (back.lifetime, back.decided_by),
            (Duration::from_secs(60), "Expires - Date")
        );
        assert_eq!(
            later.duration_since(back.age_counts_from),
            Duration::from_secs(6)
        );
        assert_eq!(
            back.fresh_until.duration_since(later),
            Duration::from_secs(54)
        );
        assert_eq!(
            back.revalidating_until.duration_since(later),
            Duration::from_secs(84)
        );

        let names: Arc<[HeaderName]> = Arc::from(vec![
            HeaderName::from_static("accept-encoding"),
            HeaderName::from_static("accept-language"),
        ]);
        let varies = Entry::Varies {
            names: names.clone(),
            generation: 0xdead_beef_0042,
        };
        let (value, _) = encode(&varies, now, monotonic).expect("varies");
        let Some(Entry::Varies {
            names: back,
            generation,
        }) = decode(&value, now, monotonic)
        else {
            panic!("the names come back");
        };
        assert_eq!((back, generation), (names, 0xdead_beef_0042));

        let old_format = b"SYC1R\x00\xc8";
        for broken in [
            &b""[..],
            b"SYC2R",
            b"SYC2R\x00\xc8",
            old_format,
            &value[..3],
        ] {
            assert!(decode(broken, now, monotonic).is_none(), "{broken:?}");
        }
    }

    #[test]
    fn an_expired_response_is_not_written() {
        let (now, monotonic) = (SystemTime::now(), Instant::now());
        let response = CachedResponse {
            status: 200,
            headers: HeaderMap::new(),
            body: Bytes::new(),
            age_counts_from: monotonic,
            lifetime: Duration::ZERO,
            decided_by: "max-age",
            fresh_until: monotonic,
            stale_until: monotonic,
            revalidating_until: monotonic,
            keep_until: monotonic,
        };
        assert!(encode(&Entry::Response(Arc::new(response)), now, monotonic).is_none());
    }
}
