//! Stage limits, an app's guardrails, checked after routing and before anything costly:
//! the client's network (403), the request's size (414, 431, 413 on a declared length),
//! the rate of the client and of the app (429 with `Retry-After`), and the app's requests
//! in flight (503 at once, or after a bounded wait). An app in `"mode": "log"` only counts.
//!
//! State is shared by every listener thread and bounded: one small record per app with
//! limits (as many as the route cache holds apps), and one rate record per client in one
//! table of `--limit-clients` entries for all apps. A client whose record was evicted
//! starts with a full bucket: an attacker rotating addresses can make limits more lenient,
//! never cost memory. Counters are kept by app name, so a change to an app's limits applies
//! on its next request and keeps what was counted.

use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use prometheus::{IntCounter, IntGauge};
use quick_cache::sync::Cache;
use switchyard_model::{ClientKey, IpNet, LimitMode, LimitScope, Limits, Rate};
use tokio::sync::Notify;

use crate::fleet_rate::FleetRates;
use crate::metrics;
use crate::request_fields::Fields;
use crate::respond::{Reason, Refusal};

/// Which limit decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    Ip,
    Uri,
    Header,
    Body,
    ClientRate,
    ClientConnections,
    AppRate,
    InFlight,
}

impl Limit {
    const ALL: [Limit; 8] = [
        Limit::Ip,
        Limit::Uri,
        Limit::Header,
        Limit::Body,
        Limit::ClientRate,
        Limit::ClientConnections,
        Limit::AppRate,
        Limit::InFlight,
    ];

    fn label(self) -> &'static str {
        match self {
            Limit::Ip => "ip",
            Limit::Uri => "uri",
            Limit::Header => "header",
            Limit::Body => "body",
            Limit::ClientRate => "client_rate",
            Limit::ClientConnections => "client_connections",
            Limit::AppRate => "app_rate",
            Limit::InFlight => "in_flight",
        }
    }
}

/// What a limit decided about a request it looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    Allowed,
    /// Allowed after waiting for a place in flight.
    Queued,
    Refused,
    /// Would have been refused; the app only counts (`"mode": "log"`).
    Logged,
}

const DECISIONS: [Decision; 4] = [
    Decision::Allowed,
    Decision::Queued,
    Decision::Refused,
    Decision::Logged,
];

impl Decision {
    fn label(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Queued => "queued",
            Decision::Refused => "refused",
            Decision::Logged => "logged",
        }
    }
}

const DENIED: Refusal = Refusal::new(Reason::NetworkDenied);
const URI_TOO_LONG: Refusal = Refusal::new(Reason::TargetTooLong);
const HEADERS_TOO_LARGE: Refusal = Refusal::new(Reason::FieldsTooLargeForApp);
const BODY_TOO_LARGE: Refusal = Refusal::new(Reason::BodyTooLarge);
const BUSY: Refusal = Refusal::new(Reason::AppBusy);
const TOO_MANY_CONNECTIONS: Refusal = Refusal::new(Reason::ClientBusy);

fn rate_limited(wait: Duration) -> Refusal {
    Refusal::new(Reason::RateLimited).come_back_in(wait.as_secs_f64().ceil().max(1.0) as u32)
}

/// The limits of every app, shared by the listener threads.
pub(crate) struct Limiter {
    apps: Cache<String, Arc<AppCounters>>,
    clients: Cache<u64, Arc<AtomicU64>>,
    /// Each client's requests in flight, for `per_client.max_connections`.
    client_connections: Cache<u64, Arc<AtomicU32>>,
    client_capacity: usize,
    /// Keys the client table: SipHash with a per-process key, so nobody can aim many
    /// clients at one record.
    hasher: RandomState,
    trusted_proxies: Vec<IpNet>,
    /// Time zero of the buckets' clocks.
    epoch: Instant,
    /// App rates counted across the fleet, with a Redis store; set once at start.
    fleet: OnceLock<Arc<FleetRates>>,
}

/// One app's counters, kept by name across changes to the app.
struct AppCounters {
    /// The app's bucket: the theoretical arrival time of the next request (GCRA), in
    /// nanoseconds since [`Limiter::epoch`].
    bucket: AtomicU64,
    in_flight: AtomicU32,
    waiting: AtomicU32,
    /// Woken when a place in flight frees.
    room: Notify,
    /// Made on first use, like the decision counters.
    in_flight_gauge: OnceLock<IntGauge>,
    /// The decision counters, made on first use: an app that only sets a body limit
    /// exports no rate series.
    decisions: [[OnceLock<IntCounter>; DECISIONS.len()]; Limit::ALL.len()],
    app: String,
}

impl AppCounters {
    fn new(app: &str) -> Self {
        Self {
            bucket: AtomicU64::new(0),
            in_flight: AtomicU32::new(0),
            waiting: AtomicU32::new(0),
            room: Notify::new(),
            in_flight_gauge: OnceLock::new(),
            decisions: Default::default(),
            app: app.to_string(),
        }
    }

    fn in_flight_gauge(&self) -> &IntGauge {
        self.in_flight_gauge
            .get_or_init(|| metrics::APP_IN_FLIGHT.with_label_values(&[&self.app]))
    }

    fn count(&self, limit: Limit, decision: Decision) {
        let counter = &self.decisions[limit as usize][decision as usize];
        counter
            .get_or_init(|| {
                metrics::LIMIT_DECISIONS.with_label_values(&[
                    &self.app,
                    limit.label(),
                    decision.label(),
                ])
            })
            .inc();
    }
}

/// What an admitted request holds until its answer ends (a WebSocket's until it closes).
#[derive(Debug, Default)]
pub(crate) struct Places {
    #[allow(dead_code)] // held for its Drop
    app: Option<InFlightPlace>,
    #[allow(dead_code)] // held for its Drop
    client: Option<ClientPlace>,
}

/// A place among a client's requests in flight to an app.
#[derive(Debug)]
pub(crate) struct ClientPlace {
    count: Arc<AtomicU32>,
}

impl Drop for ClientPlace {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A place among an app's requests in flight, given back when dropped (the answer's end,
/// or a WebSocket's close).
#[derive(Debug)]
pub(crate) struct InFlightPlace {
    counters: Arc<AppCounters>,
}

impl std::fmt::Debug for AppCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppCounters")
            .field("app", &self.app)
            .finish()
    }
}

impl Drop for InFlightPlace {
    fn drop(&mut self) {
        self.counters.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.counters.in_flight_gauge().dec();
        self.counters.room.notify_one();
    }
}

/// What the stage needs of a request.
pub(crate) struct Request<'a> {
    pub(crate) app: &'a str,
    pub(crate) limits: &'a Limits,
    pub(crate) peer: IpAddr,
    pub(crate) fields: Fields<'a>,
    /// Path and query, as the client sent them.
    pub(crate) target_len: usize,
    pub(crate) declared_length: Option<u64>,
}

impl Limiter {
    /// Limits for up to `apps` apps with limits and `clients` client records, trusting
    /// `X-Forwarded-For` from `trusted_proxies` only.
    pub(crate) fn new(apps: usize, clients: usize, trusted_proxies: Vec<IpNet>) -> Self {
        metrics::LIMIT_CLIENT_CAPACITY.set(clients as i64);
        Self {
            apps: Cache::new(apps.max(1)),
            clients: Cache::new(clients.max(1)),
            client_connections: Cache::new(clients.max(1)),
            client_capacity: clients.max(1),
            hasher: RandomState::new(),
            trusted_proxies,
            epoch: Instant::now(),
            fleet: OnceLock::new(),
        }
    }

    /// App rates with `"scope": "fleet"` are counted with the other routers through
    /// `fleet`; without it they are counted here alone.
    pub(crate) fn count_fleet_rates_with(&self, fleet: Arc<FleetRates>) {
        let _ = self.fleet.set(fleet);
    }

    /// Admits the request, or says how it is refused. An admitted request holds its places
    /// (`max_in_flight`, `per_client.max_connections`) until the returned value is dropped.
    pub(crate) async fn admit(&self, request: Request<'_>) -> Result<Places, Refusal> {
        let limits = request.limits;
        let counters = self.counters(request.app);
        let enforce = limits.mode == LimitMode::Enforce;
        // Each check: refused when enforced, counted either way.
        let decide = |limit: Limit, passed: bool, refusal: Refusal| -> Result<(), Refusal> {
            match (passed, enforce) {
                (true, _) => {
                    counters.count(limit, Decision::Allowed);
                    Ok(())
                }
                (false, true) => {
                    counters.count(limit, Decision::Refused);
                    Err(refusal)
                }
                (false, false) => {
                    counters.count(limit, Decision::Logged);
                    Ok(())
                }
            }
        };
        let client_ip = self.client_ip(request.peer, request.fields);
        if !limits.allow.is_empty() || !limits.deny.is_empty() {
            decide(Limit::Ip, !limits.denies(client_ip), DENIED)?;
        }
        if let Some(max) = limits.max_uri_bytes {
            decide(Limit::Uri, request.target_len <= max as usize, URI_TOO_LONG)?;
        }
        if let Some(max) = limits.max_header_bytes {
            decide(
                Limit::Header,
                request.fields.head_bytes() <= max as usize,
                HEADERS_TOO_LARGE,
            )?;
        }
        if let (Some(max), Some(declared)) = (limits.max_body_bytes, request.declared_length) {
            decide(Limit::Body, declared <= max, BODY_TOO_LARGE)?;
        }
        let now = self.now();
        let mut places = Places::default();
        if let Some(per_client) = &limits.per_client {
            let key = self.client_key(request.app, &per_client.key, client_ip, request.fields);
            if let Some(rate) = per_client.rate {
                let taken = take(&self.client_bucket(key), now, rate);
                decide(Limit::ClientRate, taken.is_ok(), rate_limited(wait(taken)))?;
            }
            if let Some(max) = per_client.max_connections {
                let count = self.client_connections(key);
                // Counted in log mode too (past the limit), so the places given back match.
                let entered = count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < max || !enforce).then_some(n + 1)
                });
                match entered {
                    Ok(before) => {
                        places.client = Some(ClientPlace { count });
                        decide(Limit::ClientConnections, before < max, TOO_MANY_CONNECTIONS)?;
                    }
                    Err(_) => decide(Limit::ClientConnections, false, TOO_MANY_CONNECTIONS)?,
                }
            }
        }
        if let Some(rate) = limits.rate {
            // A fleet-wide rate is also paced here: between two syncs a router cannot see
            // the others, and unpaced it could admit a whole second's worth at once.
            let taken = match (self.fleet.get(), take(&counters.bucket, now, rate)) {
                (Some(fleet), Ok(())) if limits.scope == LimitScope::Fleet => {
                    fleet.take(request.app, rate.requests_per_s)
                }
                (_, taken) => taken,
            };
            decide(Limit::AppRate, taken.is_ok(), rate_limited(wait(taken)))?;
        }
        let Some(max) = limits.max_in_flight else {
            return Ok(places);
        };
        if let Some(place) = try_enter(&counters, max) {
            counters.count(Limit::InFlight, Decision::Allowed);
            places.app = Some(place);
            return Ok(places);
        }
        if !enforce {
            counters.count(Limit::InFlight, Decision::Logged);
            places.app = Some(enter_anyway(&counters));
            return Ok(places);
        }
        let queue = Duration::from_millis(limits.queue_ms);
        match wait_for_place(&counters, max, queue).await {
            Some(place) => {
                counters.count(Limit::InFlight, Decision::Queued);
                places.app = Some(place);
                Ok(places)
            }
            None => {
                counters.count(Limit::InFlight, Decision::Refused);
                Err(BUSY)
            }
        }
    }

    /// The client's address: the peer's, or behind trusted proxies the last address in
    /// `X-Forwarded-For` that is not one of them (what a client puts in front is not
    /// believed).
    pub(crate) fn client_ip(&self, peer: IpAddr, fields: Fields<'_>) -> IpAddr {
        if !self.trusts(peer) {
            return peer;
        }
        let mut client = peer;
        // Behind a trusted proxy only: the fields are walked backwards, from a list.
        let forwarded: Vec<&[u8]> = fields.values("x-forwarded-for").collect();
        for value in forwarded.into_iter().rev() {
            let Ok(text) = std::str::from_utf8(value) else {
                return client;
            };
            for hop in text.rsplit(',') {
                match hop.trim().parse::<IpAddr>() {
                    Ok(ip) if self.trusts(ip) => client = ip,
                    Ok(ip) => return ip,
                    Err(_) => return client,
                }
            }
        }
        client
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        self.trusted_proxies.iter().any(|net| net.contains(&ip))
    }

    fn counters(&self, app: &str) -> Arc<AppCounters> {
        get_or_make(&self.apps, app, || AppCounters::new(app))
    }

    fn client_key(&self, app: &str, key: &ClientKey, ip: IpAddr, fields: Fields<'_>) -> u64 {
        // A request without the header or cookie is keyed by its address: leaving it out
        // must not be a way around the limit.
        let value = match key {
            ClientKey::ClientIp => None,
            ClientKey::Header(name) => fields.values(name.as_str()).next(),
            ClientKey::Cookie(name) => cookie(fields, name),
        };
        match value {
            Some(value) => self.hasher.hash_one((app, 1u8, value)),
            None => self.hasher.hash_one((app, 0u8, ip)),
        }
    }

    fn client_bucket(&self, key: u64) -> Arc<AtomicU64> {
        get_or_make(&self.clients, &key, || {
            // A new client: the table grows by one, up to its capacity.
            let held = self.clients.len() + 1;
            metrics::LIMIT_CLIENTS.set(held.min(self.client_capacity) as i64);
            AtomicU64::new(0)
        })
    }

    fn client_connections(&self, key: u64) -> Arc<AtomicU32> {
        get_or_make(&self.client_connections, &key, || AtomicU32::new(0))
    }

    fn now(&self) -> u64 {
        // From 1 s on, so a fresh bucket (0) is a full one.
        1_000_000_000 + self.epoch.elapsed().as_nanos() as u64
    }
}

/// The value kept under `key`, made by `make` when absent. Concurrent first requests for
/// one key wait for the one making it, so they all count on the same record.
fn get_or_make<K, Q, V>(cache: &Cache<K, Arc<V>>, key: &Q, make: impl FnOnce() -> V) -> Arc<V>
where
    K: Eq + std::hash::Hash + Clone,
    Q: std::hash::Hash + quick_cache::Equivalent<K> + ToOwned<Owned = K> + ?Sized,
{
    let made =
        cache.get_or_insert_with(key, || Ok::<_, std::convert::Infallible>(Arc::new(make())));
    let Ok(value) = made;
    value
}

/// Takes one request from a GCRA bucket whose state is `tat`: at most `burst` at once,
/// then one per `1 / requests_per_s`. The wait until it would pass when refused.
fn take(tat: &AtomicU64, now: u64, rate: Rate) -> Result<(), Duration> {
    let interval = 1_000_000_000 / u64::from(rate.requests_per_s.max(1));
    let tolerance = interval * u64::from(rate.burst.max(1) - 1);
    let mut current = tat.load(Ordering::Relaxed);
    loop {
        let start = current.max(now);
        let ahead = start - now;
        if ahead > tolerance {
            return Err(Duration::from_nanos(ahead - tolerance));
        }
        match tat.compare_exchange_weak(
            current,
            start + interval,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => return Ok(()),
            Err(actual) => current = actual,
        }
    }
}

fn wait(taken: Result<(), Duration>) -> Duration {
    taken.err().unwrap_or_default()
}

fn try_enter(counters: &Arc<AppCounters>, max: u32) -> Option<InFlightPlace> {
    counters
        .in_flight
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .ok()?;
    counters.in_flight_gauge().inc();
    Some(InFlightPlace {
        counters: counters.clone(),
    })
}

fn enter_anyway(counters: &Arc<AppCounters>) -> InFlightPlace {
    counters.in_flight.fetch_add(1, Ordering::AcqRel);
    counters.in_flight_gauge().inc();
    InFlightPlace {
        counters: counters.clone(),
    }
}

/// Waits up to `queue` for a place. At most as many requests wait as the limit allows in
/// flight; past that, and with no queue, the refusal is at once.
async fn wait_for_place(
    counters: &Arc<AppCounters>,
    max: u32,
    queue: Duration,
) -> Option<InFlightPlace> {
    if queue.is_zero() {
        return None;
    }
    counters
        .waiting
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .ok()?;
    let deadline = tokio::time::Instant::now() + queue;
    let place = loop {
        let room = counters.room.notified();
        tokio::pin!(room);
        room.as_mut().enable();
        if let Some(place) = try_enter(counters, max) {
            break Some(place);
        }
        if tokio::time::timeout_at(deadline, room).await.is_err() {
            break None;
        }
    };
    counters.waiting.fetch_sub(1, Ordering::AcqRel);
    place
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie<'h>(fields: Fields<'h>, name: &str) -> Option<&'h [u8]> {
    fields.values("cookie").find_map(|value| {
        value.split(|b| *b == b';').find_map(|pair| {
            let pair = pair.trim_ascii();
            let (key, value) = pair.split_at(pair.iter().position(|b| *b == b'=')?);
            (key == name.as_bytes()).then(|| &value[1..])
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::COOKIE;
    use http::HeaderMap;

    fn rate(requests_per_s: u32, burst: u32) -> Rate {
        Rate {
            requests_per_s,
            burst,
        }
    }

    #[test]
    fn a_bucket_admits_its_burst_then_its_rate() {
        let bucket = AtomicU64::new(0);
        let second = 1_000_000_000u64;
        let start = 5 * second;
        for _ in 0..3 {
            assert!(take(&bucket, start, rate(10, 3)).is_ok());
        }
        let wait = take(&bucket, start, rate(10, 3)).expect_err("past the burst");
        assert_eq!(wait, Duration::from_millis(100));
        // Over one second at a steady pace: ten more.
        let admitted = (1..=100)
            .filter(|i| take(&bucket, start + i * second / 100, rate(10, 3)).is_ok())
            .count();
        assert_eq!(admitted, 10);
    }

    #[test]
    fn forwarded_addresses_are_believed_from_trusted_proxies_only() {
        let limiter = Limiter::new(10, 10, vec!["10.0.0.0/8".parse().expect("net")]);
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-forwarded-for",
            "6.6.6.6, 198.51.100.7, 10.1.1.1".parse().expect("value"),
        );
        let proxy: IpAddr = "10.0.0.2".parse().expect("ip");
        let stranger: IpAddr = "203.0.113.9".parse().expect("ip");
        assert_eq!(
            limiter.client_ip(proxy, Fields::Map(&headers)),
            "198.51.100.7".parse::<IpAddr>().expect("ip")
        );
        assert_eq!(limiter.client_ip(stranger, Fields::Map(&headers)), stranger);
        assert_eq!(
            limiter.client_ip(proxy, Fields::Map(&HeaderMap::new())),
            proxy
        );
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(COOKIE, "a=1; session=abc; b=2".parse().expect("value"));
        assert_eq!(cookie(Fields::Map(&headers), "session"), Some(&b"abc"[..]));
        assert_eq!(cookie(Fields::Map(&headers), "sess"), None);
    }

    #[test]
    fn the_client_table_stays_within_its_capacity() {
        let limiter = Limiter::new(10, 1000, Vec::new());
        for i in 0..20_000u32 {
            let ip = IpAddr::from(i.to_be_bytes());
            let key = limiter.client_key(
                "app",
                &ClientKey::ClientIp,
                ip,
                Fields::Map(&HeaderMap::new()),
            );
            let _ = take(&limiter.client_bucket(key), limiter.now(), rate(1, 1));
        }
        assert!(limiter.clients.len() <= 1000, "{}", limiter.clients.len());
    }
}
