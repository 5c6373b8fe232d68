//! Certificates obtained by ACME: what the store keeps about each domain's certificate
//! (its state machine), the HTTP-01 answers every router serves, and the pure rules the
//! issuer follows (back-off after a failure, when to renew).

use serde::{Deserialize, Serialize};

/// First wait after a failed order; doubled after each further failure.
const FIRST_BACKOFF_S: i64 = 60;
/// Longest wait between two tries: one a day.
const MAX_BACKOFF_S: i64 = 86_400;
/// Let's Encrypt's limit of failed validations per name per hour, kept locally.
pub const FAILURES_PER_HOUR: usize = 5;
/// Let's Encrypt's limit of duplicate certificates (the same names) per week, kept locally.
pub const DUPLICATES_PER_WEEK: usize = 5;
const HOUR: i64 = 3600;
/// How often an issued certificate's renewal information is asked for.
const ARI_EVERY_S: i64 = 6 * HOUR;
const WEEK: i64 = 7 * 86_400;

/// Where a domain's ACME certificate stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AcmeStatus {
    /// Wanted, not ordered yet (or waiting for the issuer's turn).
    Pending,
    /// An order is open: challenges published, the CA checking them.
    Validating,
    /// A certificate from the CA is stored and served.
    Issued,
    /// The last order failed; `next_try_unix` says when the next one starts.
    Failed,
    /// Cannot be ordered by this router (a wildcard needs DNS-01).
    Unsupported,
}

impl AcmeStatus {
    /// Every status, for metrics that show each at zero.
    pub const ALL: [AcmeStatus; 5] = [
        AcmeStatus::Pending,
        AcmeStatus::Validating,
        AcmeStatus::Issued,
        AcmeStatus::Failed,
        AcmeStatus::Unsupported,
    ];

    /// The name used in JSON and metric labels.
    pub fn label(self) -> &'static str {
        match self {
            AcmeStatus::Pending => "pending",
            AcmeStatus::Validating => "validating",
            AcmeStatus::Issued => "issued",
            AcmeStatus::Failed => "failed",
            AcmeStatus::Unsupported => "unsupported",
        }
    }
}

/// One domain's ACME state, as stored and shown by the admin API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AcmeDomain {
    /// The domain (exact, as the app lists it).
    pub domain: String,
    /// Where it stands.
    pub status: AcmeStatus,
    /// Failed orders in a row; back to 0 once issued.
    #[serde(default)]
    pub attempts: u32,
    /// The CA's reason for the last failure, or why the domain is unsupported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the next order may start (after a failure), seconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_try_unix: Option<i64>,
    /// End of validity of the certificate it issued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after_unix: Option<i64>,
    /// When that certificate is renewed (two thirds into its lifetime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_at_unix: Option<i64>,
    /// The issuer of that certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// SHA-256 of that certificate (hex): a stored certificate with another fingerprint was
    /// uploaded, and an uploaded certificate wins while it is valid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Certificates issued for it so far.
    #[serde(default)]
    pub issued_count: u32,
    /// When its last failed orders ended (the last [`FAILURES_PER_HOUR`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_failures_unix: Vec<i64>,
    /// When its last certificates were issued (the last [`DUPLICATES_PER_WEEK`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_issues_unix: Vec<i64>,
    /// When the CA's renewal information (ARI) was last asked for this certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ari_checked_unix: Option<i64>,
    /// Last change of this record, seconds since the epoch.
    pub updated_unix: i64,
}

impl AcmeDomain {
    /// A domain just found wanting a certificate.
    pub fn pending(domain: &str, now: i64) -> Self {
        Self {
            domain: domain.to_string(),
            status: AcmeStatus::Pending,
            attempts: 0,
            reason: None,
            next_try_unix: None,
            not_after_unix: None,
            renew_at_unix: None,
            issuer: None,
            sha256: None,
            issued_count: 0,
            recent_failures_unix: Vec::new(),
            recent_issues_unix: Vec::new(),
            ari_checked_unix: None,
            updated_unix: now,
        }
    }

    /// Records a failed order: the reason, one more attempt, and the wait before the next:
    /// the back-off, or longer when the CA's limit of failures per name per hour is reached.
    pub fn failed(&mut self, reason: String, now: i64) {
        self.status = AcmeStatus::Failed;
        self.attempts = self.attempts.saturating_add(1);
        keep_last(&mut self.recent_failures_unix, now, FAILURES_PER_HOUR);
        let mut next_try = now + backoff_s(self.attempts);
        if self.recent_failures_unix.len() == FAILURES_PER_HOUR {
            next_try = next_try.max(self.recent_failures_unix[0] + HOUR);
        }
        self.next_try_unix = Some(next_try);
        self.reason = Some(reason);
        self.updated_unix = now;
    }

    /// Records an issued certificate valid from `not_before` to `not_after`.
    pub fn issued(
        &mut self,
        issuer: String,
        sha256: String,
        not_before: i64,
        not_after: i64,
        now: i64,
    ) {
        self.status = AcmeStatus::Issued;
        self.attempts = 0;
        self.reason = None;
        self.next_try_unix = None;
        self.not_after_unix = Some(not_after);
        self.renew_at_unix = Some(renew_at(not_before, not_after));
        self.issuer = Some(issuer);
        self.sha256 = Some(sha256);
        self.issued_count = self.issued_count.saturating_add(1);
        keep_last(&mut self.recent_issues_unix, now, DUPLICATES_PER_WEEK);
        self.ari_checked_unix = None;
        self.updated_unix = now;
    }

    /// Whether to ask the CA's renewal information again: an issued certificate, every six
    /// hours (Let's Encrypt's own suggestion when it gives no Retry-After).
    pub fn ari_due(&self, now: i64) -> bool {
        self.status == AcmeStatus::Issued
            && self
                .ari_checked_unix
                .is_none_or(|checked| now - checked >= ARI_EVERY_S)
    }

    /// Takes the CA's suggested renewal window (ARI) into account: the renewal moves to
    /// `pick` within it when the window opens before the planned time (the CA wants the
    /// certificate replaced sooner: a revocation coming, a shorter lifetime). A window
    /// after the planned time changes nothing: two thirds of the lifetime is never late.
    pub fn consider_renewal_window(&mut self, start: i64, end: i64, pick: i64, now: i64) {
        self.ari_checked_unix = Some(now);
        self.updated_unix = now;
        if end < start {
            return;
        }
        if self.renew_at_unix.is_none_or(|planned| start < planned) {
            self.renew_at_unix = Some(pick.clamp(start, end));
        }
    }

    /// Until when the CA's limit of duplicate certificates per week holds a new order back.
    pub fn duplicates_hold_until(&self) -> Option<i64> {
        (self.recent_issues_unix.len() == DUPLICATES_PER_WEEK)
            .then(|| self.recent_issues_unix[0] + WEEK)
    }

    /// Whether an order for it may start now: never while one is open elsewhere (the
    /// caller holds the fleet's lease), not before its back-off ends, and for an issued
    /// certificate not before its renewal time.
    pub fn due(&self, now: i64) -> bool {
        if self
            .duplicates_hold_until()
            .is_some_and(|until| until > now)
        {
            return false;
        }
        match self.status {
            AcmeStatus::Pending | AcmeStatus::Validating => true,
            AcmeStatus::Failed => self.next_try_unix.is_none_or(|t| t <= now),
            AcmeStatus::Issued => self.renew_at_unix.is_none_or(|t| t <= now),
            AcmeStatus::Unsupported => false,
        }
    }
}

/// Appends `time` to `times`, keeping the last `most`.
fn keep_last(times: &mut Vec<i64>, time: i64, most: usize) {
    times.push(time);
    if times.len() > most {
        times.drain(..times.len() - most);
    }
}

/// The wait after `attempts` failures in a row: 1, 2, 4 … minutes, at most a day.
pub fn backoff_s(attempts: u32) -> i64 {
    let doublings = attempts.saturating_sub(1).min(20);
    (FIRST_BACKOFF_S << doublings).min(MAX_BACKOFF_S)
}

/// When a certificate valid from `not_before` to `not_after` is renewed: two thirds into
/// its lifetime (30 days before the end of a 90-day certificate).
pub fn renew_at(not_before: i64, not_after: i64) -> i64 {
    not_before + (not_after - not_before).max(0) * 2 / 3
}

/// An HTTP-01 answer every router serves at `/.well-known/acme-challenge/{token}` while the
/// order is open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcmeChallenge {
    /// The domain being validated: only a request with this Host gets the answer.
    pub domain: String,
    /// The key authorization, the body of the answer.
    pub key_authorization: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_off_doubles_from_a_minute_to_a_day() {
        let cases = [
            (1, 60),
            (2, 120),
            (3, 240),
            (4, 480),
            (10, 30_720),
            (11, 61_440),
            (12, 86_400),
            (40, 86_400),
        ];
        for (attempts, wait) in cases {
            assert_eq!(backoff_s(attempts), wait, "{attempts} attempts");
        }
    }

    #[test]
    fn renewal_comes_two_thirds_into_the_lifetime() {
        let day = 86_400;
        assert_eq!(renew_at(0, 90 * day), 60 * day);
        assert_eq!(renew_at(1_000, 1_000 + 6 * day), 1_000 + 4 * day);
        assert_eq!(
            renew_at(500, 100),
            500,
            "a lifetime that makes no sense renews at once"
        );
    }

    #[test]
    fn a_domain_is_due_by_its_status_and_times() {
        let now = 1_000_000;
        let mut domain = AcmeDomain::pending("shop.test", now);
        assert!(domain.due(now));
        domain.failed("connection refused".into(), now);
        assert_eq!(domain.attempts, 1);
        assert!(!domain.due(now + 59));
        assert!(domain.due(now + 60));
        domain.failed("again".into(), now + 60);
        assert_eq!(domain.next_try_unix, Some(now + 60 + 120));
        domain.issued("CN=Pebble".into(), "ab".into(), now, now + 90, now + 200);
        assert_eq!(domain.attempts, 0);
        assert_eq!(domain.reason, None);
        assert!(!domain.due(now + 59));
        assert!(domain.due(now + 60), "renewal at two thirds of 90 s");
        let unsupported = AcmeDomain {
            status: AcmeStatus::Unsupported,
            ..AcmeDomain::pending("*.shop.test", now)
        };
        assert!(!unsupported.due(now + MAX_BACKOFF_S));
    }

    #[test]
    fn a_renewal_window_that_opens_sooner_moves_the_renewal() {
        let day = 86_400;
        let mut domain = AcmeDomain::pending("shop.test", 0);
        domain.issued("CN=CA".into(), "ab".into(), 0, 90 * day, 0);
        assert_eq!(domain.renew_at_unix, Some(60 * day));
        domain.consider_renewal_window(70 * day, 75 * day, 72 * day, day);
        assert_eq!(
            domain.renew_at_unix,
            Some(60 * day),
            "a later window changes nothing"
        );
        assert_eq!(domain.ari_checked_unix, Some(day));
        domain.consider_renewal_window(2 * day, 3 * day, 2 * day + 100, 2 * day);
        assert_eq!(
            domain.renew_at_unix,
            Some(2 * day + 100),
            "revoked soon: renewed within it"
        );
        assert!(domain.due(2 * day + 100));
        domain.consider_renewal_window(5, 1, 3, 2 * day);
        assert_eq!(
            domain.renew_at_unix,
            Some(2 * day + 100),
            "a window that ends before it starts"
        );
    }

    #[test]
    fn the_cas_limits_per_name_hold_orders_back() {
        let start = 1_000_000;
        let mut domain = AcmeDomain::pending("shop.test", start);
        // Failures at once after each back-off: 1, 2, 4, 8 minutes apart.
        let mut now = start;
        for _ in 0..4 {
            domain.failed("refused".into(), now);
            now = domain.next_try_unix.expect("next try");
        }
        assert_eq!(now, start + (1 + 2 + 4 + 8) * 60);
        domain.failed("refused".into(), now);
        assert_eq!(
            domain.next_try_unix,
            Some(start + HOUR),
            "the fifth failure in an hour waits for the hour, past its 16-minute back-off"
        );
        assert_eq!(domain.recent_failures_unix.len(), FAILURES_PER_HOUR);

        let mut renewed = AcmeDomain::pending("shop.test", start);
        for i in 0..5 {
            renewed.issued("CN=CA".into(), format!("{i}"), start, start + 10, start + i);
        }
        assert_eq!(renewed.duplicates_hold_until(), Some(start + WEEK));
        assert!(!renewed.due(start + 100), "five in a week: the sixth waits");
        assert!(renewed.due(start + WEEK));
        renewed.issued("CN=CA".into(), "5".into(), start, start + 10, start + WEEK);
        assert_eq!(renewed.recent_issues_unix.len(), DUPLICATES_PER_WEEK);
        assert_eq!(renewed.recent_issues_unix[0], start + 1, "the oldest goes");
    }
}

/// A TLS-ALPN-01 answer (RFC 8737) every router serves to a handshake for `domain` that
/// offers only the `acme-tls/1` protocol, while the order is open: a self-signed
/// certificate naming the domain and carrying the key authorization's digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcmeTlsAlpnAnswer {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PEM.
    pub key_pem: String,
}
