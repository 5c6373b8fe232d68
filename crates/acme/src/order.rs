//! One ACME order for one domain, from the new order to the stored certificate: HTTP-01
//! answers published in the store (every router serves them), the CA told to check, the
//! key and CSR made with OpenSSL, the chain validated like an upload.

use std::time::Duration;

use instant_acme::{
    Account, AuthorizationStatus, ChallengeType, Identifier, NewOrder, OrderStatus, RetryPolicy,
};
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::stack::Stack;
use openssl::x509::extension::SubjectAlternativeName;
use openssl::x509::{X509NameBuilder, X509ReqBuilder};
use switchyard_model::{parse_certificate_spec, AcmeChallenge, StoredCertificate};
use switchyard_store::{acme, AcmeRecord, Store};

/// How long the CA may take to validate, and then to issue.
const POLL: RetryPolicy = RetryPolicy::new()
    .initial_delay(Duration::from_millis(100))
    .backoff(1.5)
    .timeout(Duration::from_secs(90));

/// Orders a certificate for `domain` and returns it validated, ready to store; the error is
/// the CA's reason (or ours), for the domain's state.
pub(crate) async fn certificate_for(
    account: &Account,
    store: &dyn Store,
    domain: &str,
) -> Result<StoredCertificate, String> {
    let mut tokens = Vec::new();
    let outcome = run(account, store, domain, &mut tokens).await;
    // The answers are no use once the order is over, whatever its end.
    for token in tokens {
        if let Err(e) = store.acme_delete(AcmeRecord::Challenge(&token)).await {
            log::debug!("acme: could not remove the answer for {domain}: {e}");
        }
    }
    outcome
}

async fn run(
    account: &Account,
    store: &dyn Store,
    domain: &str,
    tokens: &mut Vec<String>,
) -> Result<StoredCertificate, String> {
    let identifiers = [Identifier::Dns(domain.to_string())];
    let mut order = account
        .new_order(&NewOrder::new(&identifiers))
        .await
        .map_err(|e| format!("new order: {e}"))?;

    let mut authorizations = order.authorizations();
    while let Some(authorization) = authorizations.next().await {
        let mut authorization = authorization.map_err(|e| format!("authorization: {e}"))?;
        match authorization.status {
            AuthorizationStatus::Pending => {}
            AuthorizationStatus::Valid => continue,
            other => return Err(format!("the CA's authorization is {other:?}")),
        }
        let mut challenge = authorization
            .challenge(ChallengeType::Http01)
            .ok_or("the CA offers no http-01 challenge")?;
        let answer = AcmeChallenge {
            domain: domain.to_string(),
            key_authorization: challenge.key_authorization().as_str().to_string(),
        };
        acme::put_challenge(store, &challenge.token, &answer)
            .await
            .map_err(|e| format!("publishing the challenge: {e}"))?;
        tokens.push(challenge.token.clone());
        challenge
            .set_ready()
            .await
            .map_err(|e| format!("challenge: {e}"))?;
    }

    let status = order
        .poll_ready(&POLL)
        .await
        .map_err(|e| format!("waiting for validation: {e}"))?;
    if status != OrderStatus::Ready {
        return Err(validation_failure(&mut order)
            .await
            .unwrap_or_else(|| format!("the order is {status:?}")));
    }

    let (key, csr) = key_and_csr(domain).map_err(|e| format!("making the key and CSR: {e}"))?;
    order
        .finalize_csr(&csr)
        .await
        .map_err(|e| format!("finalize: {e}"))?;
    let chain = order
        .poll_certificate(&POLL)
        .await
        .map_err(|e| format!("waiting for the certificate: {e}"))?;
    let key_pem = String::from_utf8(
        key.private_key_to_pem_pkcs8()
            .map_err(|e| format!("encoding the key: {e}"))?,
    )
    .map_err(|e| e.to_string())?;
    parse_certificate_spec(
        domain,
        &serde_json::json!({"cert_pem": chain, "key_pem": key_pem}),
        crate::issuer::unix_now(),
    )
    .map_err(|e| format!("the CA's certificate is refused: {e}"))
}

/// The CA's reason for an invalid order: the first failed challenge's problem.
async fn validation_failure(order: &mut instant_acme::Order) -> Option<String> {
    let mut authorizations = order.authorizations();
    while let Some(Ok(authorization)) = authorizations.next().await {
        for challenge in &authorization.challenges {
            if let Some(problem) = &challenge.error {
                return Some(match (&problem.r#type, &problem.detail) {
                    (Some(kind), Some(detail)) => format!("{detail} ({kind})"),
                    (None, Some(detail)) => detail.clone(),
                    (Some(kind), None) => kind.clone(),
                    (None, None) => "the CA refused the challenge".to_string(),
                });
            }
        }
    }
    None
}

/// A fresh P-256 key and a CSR for `domain` signed with it (DER).
fn key_and_csr(domain: &str) -> Result<(PKey<Private>, Vec<u8>), openssl::error::ErrorStack> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
    let key = PKey::from_ec_key(EcKey::generate(&group)?)?;
    let mut name = X509NameBuilder::new()?;
    name.append_entry_by_nid(Nid::COMMONNAME, domain)?;
    let name = name.build();
    let mut request = X509ReqBuilder::new()?;
    request.set_subject_name(&name)?;
    request.set_pubkey(&key)?;
    let mut extensions = Stack::new()?;
    extensions.push(
        SubjectAlternativeName::new()
            .dns(domain)
            .build(&request.x509v3_context(None))?,
    )?;
    request.add_extensions(&extensions)?;
    request.sign(&key, MessageDigest::sha256())?;
    Ok((key, request.build().to_der()?))
}
