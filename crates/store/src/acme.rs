//! The typed view of the ACME issuer's records ([`AcmeRecord`]): each domain's state and
//! the HTTP-01 and TLS-ALPN-01 answers, decoded here once for the issuer, the proxy and the admin API.

use std::time::Duration;

use switchyard_model::{AcmeChallenge, AcmeDomain, AcmeTlsAlpnAnswer};

use crate::json::{decode, encode};
use crate::{AcmeRecord, Store, StoreError};

/// How long an HTTP-01 answer stays in the store when its order never cleans it up (a
/// router killed mid-order): longer than any CA takes to validate.
pub const CHALLENGE_TTL: Duration = Duration::from_secs(3600);

/// A domain's ACME state.
pub async fn domain(store: &dyn Store, domain: &str) -> Result<Option<AcmeDomain>, StoreError> {
    store
        .acme_get(AcmeRecord::Domain(domain))
        .await?
        .map(|json| decode(domain, &json))
        .transpose()
}

/// Writes a domain's ACME state.
pub async fn put_domain(store: &dyn Store, state: &AcmeDomain) -> Result<(), StoreError> {
    let json = encode(&state.domain, state)?;
    store
        .acme_put(AcmeRecord::Domain(&state.domain), json, None)
        .await
}

/// A page of domains' ACME states, ordered by domain, and the `after` of the next page.
pub async fn domains(
    store: &dyn Store,
    after: Option<&str>,
    limit: usize,
) -> Result<(Vec<AcmeDomain>, Option<String>), StoreError> {
    let (records, next) = store.acme_domains(after, limit).await?;
    let states = records
        .iter()
        .map(|json| decode("acme domain", json))
        .collect::<Result<_, _>>()?;
    Ok((states, next))
}

/// The HTTP-01 answer for `token`, if an order published one.
pub async fn challenge(
    store: &dyn Store,
    token: &str,
) -> Result<Option<AcmeChallenge>, StoreError> {
    store
        .acme_get(AcmeRecord::Challenge(token))
        .await?
        .map(|json| decode(token, &json))
        .transpose()
}

/// The TLS-ALPN-01 answer for `domain`, if an order published one.
pub async fn tls_alpn_answer(
    store: &dyn Store,
    domain: &str,
) -> Result<Option<AcmeTlsAlpnAnswer>, StoreError> {
    store
        .acme_get(AcmeRecord::TlsAlpn(domain))
        .await?
        .map(|json| decode(domain, &json))
        .transpose()
}

/// Publishes the TLS-ALPN-01 answer for `domain` to every router of the fleet.
pub async fn put_tls_alpn_answer(
    store: &dyn Store,
    domain: &str,
    answer: &AcmeTlsAlpnAnswer,
) -> Result<(), StoreError> {
    let json = encode(domain, answer)?;
    store
        .acme_put(AcmeRecord::TlsAlpn(domain), json, Some(CHALLENGE_TTL))
        .await
}

/// Publishes the HTTP-01 answer for `token` to every router of the fleet.
pub async fn put_challenge(
    store: &dyn Store,
    token: &str,
    challenge: &AcmeChallenge,
) -> Result<(), StoreError> {
    let json = encode(token, challenge)?;
    store
        .acme_put(AcmeRecord::Challenge(token), json, Some(CHALLENGE_TTL))
        .await
}
