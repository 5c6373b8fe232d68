//! Choosing a backend for one attempt: weighted round robin or weighted power of two
//! choices, skipping backends that are passively or actively marked down, retired, or
//! already tried by this request.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use switchyard_model::Balancer;

use crate::routing::names::Endpoint;

/// How long a backend that refused a connection is skipped before it gets traffic again.
pub(crate) const PASSIVE_DOWN_FOR: Duration = Duration::from_secs(10);

/// Live state of one backend, shared by every version of its app's route so that health
/// and load survive route changes and scale operations.
#[derive(Debug)]
pub(crate) struct BackendState {
    /// Where the backend listens.
    pub(crate) address: SocketAddr,
    weight: AtomicU32,
    in_flight: AtomicUsize,
    /// Milliseconds since [`clock_origin`] until which passive health skips this backend.
    passive_down_until_ms: AtomicU64,
    active_healthy: AtomicBool,
    active_streak: AtomicU32,
    retired: AtomicBool,
}

impl BackendState {
    /// Fresh state for a backend: healthy, idle.
    pub(crate) fn new(backend: &Endpoint) -> Self {
        Self {
            address: backend.address,
            weight: AtomicU32::new(u32::from(backend.weight)),
            in_flight: AtomicUsize::new(0),
            passive_down_until_ms: AtomicU64::new(0),
            active_healthy: AtomicBool::new(true),
            active_streak: AtomicU32::new(0),
            retired: AtomicBool::new(false),
        }
    }

    /// Requests currently using this backend.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Whether this backend may receive a new request now.
    pub(crate) fn is_usable(&self) -> bool {
        self.is_usable_ignoring_passive_marks()
            && self.passive_down_until_ms.load(Ordering::Relaxed) <= now_ms()
    }

    /// Whether this backend may receive a request when no backend without a passive mark
    /// is left: not retired and not failing its active checks.
    pub(crate) fn is_usable_ignoring_passive_marks(&self) -> bool {
        !self.retired.load(Ordering::Relaxed) && self.active_healthy.load(Ordering::Relaxed)
    }

    /// Records a refused or timed-out connection: skip this backend for [`PASSIVE_DOWN_FOR`].
    pub(crate) fn mark_passively_down(&self) {
        let until = now_ms() + PASSIVE_DOWN_FOR.as_millis() as u64;
        self.passive_down_until_ms.store(until, Ordering::Relaxed);
    }

    /// Records one active probe; returns `Some(new_state)` when the backend flips.
    pub(crate) fn record_probe(
        &self,
        ok: bool,
        healthy_after: u32,
        unhealthy_after: u32,
    ) -> Option<bool> {
        let healthy = self.active_healthy.load(Ordering::Relaxed);
        if ok == healthy {
            self.active_streak.store(0, Ordering::Relaxed);
            return None;
        }
        let streak = self.active_streak.fetch_add(1, Ordering::Relaxed) + 1;
        let needed = if ok { healthy_after } else { unhealthy_after };
        if streak >= needed {
            self.active_healthy.store(ok, Ordering::Relaxed);
            self.active_streak.store(0, Ordering::Relaxed);
            if ok {
                // A backend that passes its checks again deserves traffic now.
                self.passive_down_until_ms.store(0, Ordering::Relaxed);
            }
            return Some(ok);
        }
        None
    }

    /// Marks the backend as removed: it gets no new requests, even from a request still
    /// holding an older version of its app's route (a retry). Its open connections are the
    /// drain's concern, not the balancer's.
    pub(crate) fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
    }

    /// Takes the backend back into service (it was re-added before its drain finished).
    pub(crate) fn unretire(&self) {
        self.retired.store(false, Ordering::Relaxed);
    }

    /// Its share of requests relative to the app's other backends.
    pub(crate) fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    /// Whether its active health checks (if any) pass.
    pub(crate) fn passes_active_checks(&self) -> bool {
        self.active_healthy.load(Ordering::Relaxed)
    }

    /// Whether a refused connection keeps it skipped for now.
    pub(crate) fn is_passively_down(&self) -> bool {
        self.passive_down_until_ms.load(Ordering::Relaxed) > now_ms()
    }

    /// Whether it was removed from its app (draining, no new requests).
    pub(crate) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Relaxed)
    }

    fn set_weight(&self, weight: u16) {
        self.weight.store(u32::from(weight), Ordering::Relaxed);
    }
}

/// Counts a request against its backend for as long as it lives.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<BackendState>);

impl InFlight {
    fn start(backend: Arc<BackendState>) -> Self {
        backend.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(backend)
    }

    /// The backend this request is using.
    pub(crate) fn backend(&self) -> &Arc<BackendState> {
        &self.0
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The outcome of a pick.
#[derive(Debug)]
pub(crate) enum Pick {
    /// Use this backend; the guard counts the request against it.
    Backend(InFlight),
    /// The app has backends but none is usable (down, retired or already tried): 502.
    NoneHealthy,
    /// The app has no backends at all: 503.
    NoBackends,
}

/// An app's backends and the policy that spreads requests over them.
#[derive(Debug)]
pub(crate) struct Upstream {
    backends: Vec<Arc<BackendState>>,
    /// Backend indices in smooth weighted round-robin order; one cycle is the weights' sum.
    schedule: Vec<u16>,
    cursor: AtomicUsize,
    policy: Balancer,
}

impl Upstream {
    /// Builds an upstream, reusing the live state of backends `previous` already had, so that
    /// load counts, health and open connections carry over a route change.
    pub(crate) fn new(
        backends: &[Endpoint],
        policy: Balancer,
        previous: Option<&Upstream>,
    ) -> Self {
        let states: Vec<Arc<BackendState>> = backends
            .iter()
            .map(|b| {
                let reused = previous.and_then(|p| p.find(b.address)).cloned();
                match reused {
                    Some(state) => {
                        state.set_weight(b.weight);
                        state.unretire();
                        state
                    }
                    None => Arc::new(BackendState::new(b)),
                }
            })
            .collect();
        let weights: Vec<u16> = backends.iter().map(|b| b.weight).collect();
        Self {
            backends: states,
            schedule: smooth_weighted_schedule(&weights),
            cursor: AtomicUsize::new(0),
            policy,
        }
    }

    /// The backends, in configuration order.
    pub(crate) fn backends(&self) -> &[Arc<BackendState>] {
        &self.backends
    }

    /// Retires the backends that `next`, the app's new version, no longer lists.
    pub(crate) fn retire_missing_from(&self, next: &Upstream) {
        for backend in &self.backends {
            if next.find(backend.address).is_none() {
                backend.retire();
            }
        }
    }

    /// Retires every backend (the app was deleted).
    pub(crate) fn retire_all(&self) {
        for backend in &self.backends {
            backend.retire();
        }
    }

    /// The state of the backend at `address`, if it belongs to this upstream.
    pub(crate) fn find(&self, address: SocketAddr) -> Option<&Arc<BackendState>> {
        self.backends.iter().find(|b| b.address == address)
    }

    /// Chooses a backend for one attempt, skipping those in `tried`.
    ///
    /// Passive marks only steer traffic away while another backend can take it: when every
    /// untried backend is passively down, they are tried anyway (Envoy's panic mode). A
    /// single-container app whose container restarts would otherwise get 502 without a try
    /// for [`PASSIVE_DOWN_FOR`] after it is back.
    pub(crate) fn pick(&self, tried: &[SocketAddr]) -> Pick {
        if self.backends.is_empty() {
            return Pick::NoBackends;
        }
        let usable = |b: &BackendState| b.is_usable() && !tried.contains(&b.address);
        let chosen = self.pick_by_policy(usable).or_else(|| {
            self.pick_by_policy(|b: &BackendState| {
                b.is_usable_ignoring_passive_marks() && !tried.contains(&b.address)
            })
        });
        match chosen {
            Some(state) => Pick::Backend(InFlight::start(state.clone())),
            None => Pick::NoneHealthy,
        }
    }

    /// [`Upstream::pick`], but `preferred` (a sticky session's backend) when it is one of
    /// these backends, usable and not tried yet.
    pub(crate) fn pick_preferring(&self, preferred: SocketAddr, tried: &[SocketAddr]) -> Pick {
        match self.find(preferred) {
            Some(state) if state.is_usable() && !tried.contains(&preferred) => {
                Pick::Backend(InFlight::start(state.clone()))
            }
            _ => self.pick(tried),
        }
    }

    /// The backend [`Upstream::pick`] would choose next, without choosing it, and whether
    /// passive marks had to be ignored to find one. For `least_loaded`, whose pick draws
    /// two at random, the least loaded usable backend now.
    pub(crate) fn peek(&self) -> Option<(&Arc<BackendState>, bool)> {
        let first_usable = |eligible: &dyn Fn(&BackendState) -> bool| match self.policy {
            Balancer::RoundRobin => {
                self.first_in_cycle_from(self.cursor.load(Ordering::Relaxed), eligible)
            }
            Balancer::LeastLoaded => self
                .backends
                .iter()
                .filter(|b| eligible(b))
                .min_by_key(|b| (b.in_flight() as u64 * 1_000_000) / u64::from(b.weight().max(1))),
        };
        first_usable(&|b: &BackendState| b.is_usable())
            .map(|b| (b, false))
            .or_else(|| {
                first_usable(&|b: &BackendState| b.is_usable_ignoring_passive_marks())
                    .map(|b| (b, true))
            })
    }

    fn pick_by_policy(
        &self,
        eligible: impl Fn(&BackendState) -> bool,
    ) -> Option<&Arc<BackendState>> {
        match self.policy {
            Balancer::RoundRobin => self.pick_round_robin(eligible),
            Balancer::LeastLoaded => self.pick_least_loaded(eligible),
        }
    }

    fn pick_round_robin(
        &self,
        eligible: impl Fn(&BackendState) -> bool,
    ) -> Option<&Arc<BackendState>> {
        self.first_in_cycle_from(self.cursor.fetch_add(1, Ordering::Relaxed), eligible)
    }

    /// The first eligible backend of the weighted cycle from position `start` on.
    fn first_in_cycle_from(
        &self,
        start: usize,
        eligible: impl Fn(&BackendState) -> bool,
    ) -> Option<&Arc<BackendState>> {
        let len = self.schedule.len();
        (0..len)
            .map(|step| &self.backends[usize::from(self.schedule[(start + step) % len])])
            .find(|b| eligible(b))
    }

    fn pick_least_loaded(
        &self,
        eligible: impl Fn(&BackendState) -> bool,
    ) -> Option<&Arc<BackendState>> {
        let candidates: Vec<&Arc<BackendState>> =
            self.backends.iter().filter(|b| eligible(b)).collect();
        match candidates.len() {
            0 => None,
            1 => Some(candidates[0]),
            n => {
                let mut rng = rand::thread_rng();
                let first = rng.gen_range(0..n);
                let second = (first + rng.gen_range(1..n)) % n;
                let (a, b) = (candidates[first], candidates[second]);
                // Compare load per unit of weight without dividing: a/wa <= b/wb.
                let load_a = (a.in_flight() as u64) * u64::from(b.weight.load(Ordering::Relaxed));
                let load_b = (b.in_flight() as u64) * u64::from(a.weight.load(Ordering::Relaxed));
                Some(if load_a <= load_b { a } else { b })
            }
        }
    }
}

/// nginx's smooth weighted round robin, unrolled into one cycle: weights 5,1,1 give
/// a a b a c a a rather than a a a a a b c. Weights are reduced by their gcd first.
fn smooth_weighted_schedule(weights: &[u16]) -> Vec<u16> {
    if weights.is_empty() {
        return Vec::new();
    }
    let divisor = weights
        .iter()
        .fold(0u32, |g, &w| gcd(g, u32::from(w)))
        .max(1);
    let reduced: Vec<i64> = weights
        .iter()
        .map(|&w| i64::from(u32::from(w) / divisor))
        .collect();
    let total: i64 = reduced.iter().sum();
    let mut current = vec![0i64; reduced.len()];
    let mut schedule = Vec::with_capacity(total as usize);
    for _ in 0..total {
        for (c, w) in current.iter_mut().zip(&reduced) {
            *c += w;
        }
        let (best, _) = current
            .iter()
            .enumerate()
            .max_by(|(i, a), (j, b)| a.cmp(b).then(j.cmp(i)))
            .unwrap_or((0, &0));
        current[best] -= total;
        schedule.push(best as u16);
    }
    schedule
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn clock_origin() -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    // +1 so that 0 always means "never marked down".
    clock_origin().elapsed().as_millis() as u64 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backends(weights: &[u16]) -> Vec<Endpoint> {
        weights
            .iter()
            .enumerate()
            .map(|(i, &weight)| Endpoint {
                address: SocketAddr::from(([127, 0, 0, 1], 9000 + i as u16)),
                weight,
            })
            .collect()
    }

    fn picks(upstream: &Upstream, n: usize) -> Vec<u16> {
        (0..n)
            .map(|_| match upstream.pick(&[]) {
                Pick::Backend(guard) => guard.backend().address.port() - 9000,
                other => panic!("expected a backend, got {other:?}"),
            })
            .collect()
    }

    #[test]
    fn smooth_schedule_interleaves_by_weight() {
        assert_eq!(smooth_weighted_schedule(&[5, 1, 1]), [0, 0, 1, 0, 2, 0, 0]);
        assert_eq!(smooth_weighted_schedule(&[2, 2]), [0, 1]);
        assert_eq!(smooth_weighted_schedule(&[1, 1, 1]), [0, 1, 2]);
        assert!(smooth_weighted_schedule(&[]).is_empty());
    }

    #[test]
    fn round_robin_honours_weights() {
        let upstream = Upstream::new(&backends(&[3, 1]), Balancer::RoundRobin, None);
        let chosen = picks(&upstream, 400);
        assert_eq!(chosen.iter().filter(|&&i| i == 0).count(), 300);
    }

    #[test]
    fn down_and_tried_backends_are_skipped() {
        let upstream = Upstream::new(&backends(&[1, 1, 1]), Balancer::RoundRobin, None);
        upstream.backends()[0].mark_passively_down();
        let tried = [upstream.backends()[1].address];
        for _ in 0..10 {
            match upstream.pick(&tried) {
                Pick::Backend(guard) => assert_eq!(guard.backend().address.port(), 9002),
                other => panic!("expected backend 2, got {other:?}"),
            }
        }
        upstream.backends()[2].retire();
        // Only the passively marked backend is left: it is tried rather than nothing.
        match upstream.pick(&tried) {
            Pick::Backend(guard) => assert_eq!(guard.backend().address.port(), 9000),
            other => panic!("expected the passively marked backend, got {other:?}"),
        }
        let all_tried = [tried[0], upstream.backends()[0].address];
        assert!(matches!(upstream.pick(&all_tried), Pick::NoneHealthy));
        upstream.backends()[1].record_probe(false, 1, 1);
        upstream.backends()[0].record_probe(false, 1, 1);
        assert!(
            matches!(upstream.pick(&[]), Pick::NoneHealthy),
            "failing active checks and retirement are not overridden"
        );
        let empty = Upstream::new(&[], Balancer::RoundRobin, None);
        assert!(matches!(empty.pick(&[]), Pick::NoBackends));
    }

    #[test]
    fn least_loaded_prefers_the_idle_backend() {
        let upstream = Upstream::new(&backends(&[1, 1]), Balancer::LeastLoaded, None);
        let mut held = Vec::new();
        for _ in 0..5 {
            if let Pick::Backend(guard) = upstream.pick(&[upstream.backends()[1].address]) {
                held.push(guard);
            }
        }
        assert_eq!(upstream.backends()[0].in_flight(), 5);
        assert!(picks(&upstream, 20).iter().all(|&i| i == 1));
        drop(held);
        assert_eq!(upstream.backends()[0].in_flight(), 0);
    }

    #[test]
    fn state_carries_over_a_rebuild() {
        let first = Upstream::new(&backends(&[1, 1]), Balancer::RoundRobin, None);
        first.backends()[1].mark_passively_down();
        let second = Upstream::new(&backends(&[1, 1, 1]), Balancer::RoundRobin, Some(&first));
        assert!(Arc::ptr_eq(&first.backends()[1], &second.backends()[1]));
        assert!(!second.backends()[1].is_usable());
        assert!(second.backends()[2].is_usable());
    }

    #[test]
    fn active_checks_flip_after_thresholds() {
        let state = BackendState::new(&backends(&[1])[0]);
        assert_eq!(state.record_probe(false, 2, 2), None);
        assert_eq!(state.record_probe(false, 2, 2), Some(false));
        assert!(!state.is_usable());
        assert_eq!(state.record_probe(true, 2, 2), None);
        assert_eq!(state.record_probe(true, 2, 2), Some(true));
        assert!(state.is_usable());
    }
}
