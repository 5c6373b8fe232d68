//! One ACME order for one domain, from the new order to the stored certificate: HTTP-01 or
//! TLS-ALPN-01 answers published in the store (every router serves them), the CA told to
//! check, the key and CSR made with OpenSSL, the chain validated like an upload.

use std::time::Duration;

use instant_acme::{
    Account, AuthorizationStatus, ChallengeType, Identifier, NewOrder, OrderStatus, RetryPolicy,
};
use openssl::asn1::{Asn1Object, Asn1OctetString, Asn1Time};
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::error::ErrorStack;
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::stack::Stack;
use openssl::x509::extension::SubjectAlternativeName;
use openssl::x509::{X509Extension, X509NameBuilder, X509ReqBuilder, X509};
use switchyard_model::{
    parse_certificate_spec, AcmeChallenge, AcmeTlsAlpnAnswer, StoredCertificate,
};
use switchyard_store::{acme, AcmeRecord, Store};

use crate::ChallengeKind;

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
    kind: ChallengeKind,
) -> Result<StoredCertificate, String> {
    let mut published = Vec::new();
    let outcome = run(account, store, domain, kind, &mut published).await;
    // The answers are no use once the order is over, whatever its end.
    for answer in published {
        let record = match &answer {
            Published::Http01 { token } => AcmeRecord::Challenge(token),
            Published::TlsAlpn01 => AcmeRecord::TlsAlpn(domain),
        };
        if let Err(e) = store.acme_delete(record).await {
            log::debug!("acme: could not remove the answer for {domain}: {e}");
        }
    }
    outcome
}

/// An answer an order put in the store, removed when the order ends.
enum Published {
    Http01 { token: String },
    TlsAlpn01,
}

async fn run(
    account: &Account,
    store: &dyn Store,
    domain: &str,
    kind: ChallengeKind,
    published: &mut Vec<Published>,
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
        let (kind_offered, name) = match kind {
            ChallengeKind::Http01 => (ChallengeType::Http01, "http-01"),
            ChallengeKind::TlsAlpn01 => (ChallengeType::TlsAlpn01, "tls-alpn-01"),
        };
        let mut challenge = authorization
            .challenge(kind_offered)
            .ok_or_else(|| format!("the CA offers no {name} challenge"))?;
        let key_authorization = challenge.key_authorization();
        match kind {
            ChallengeKind::Http01 => {
                let answer = AcmeChallenge {
                    domain: domain.to_string(),
                    key_authorization: key_authorization.as_str().to_string(),
                };
                acme::put_challenge(store, &challenge.token, &answer)
                    .await
                    .map_err(|e| format!("publishing the challenge: {e}"))?;
                published.push(Published::Http01 {
                    token: challenge.token.clone(),
                });
            }
            ChallengeKind::TlsAlpn01 => {
                let answer = tls_alpn_answer(domain, key_authorization.digest().as_ref())
                    .map_err(|e| format!("making the tls-alpn-01 certificate: {e}"))?;
                acme::put_tls_alpn_answer(store, domain, &answer)
                    .await
                    .map_err(|e| format!("publishing the challenge: {e}"))?;
                published.push(Published::TlsAlpn01);
            }
        }
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

fn p256_key() -> Result<PKey<Private>, ErrorStack> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
    PKey::from_ec_key(EcKey::generate(&group)?)
}

/// A fresh P-256 key and a CSR for `domain` signed with it (DER).
fn key_and_csr(domain: &str) -> Result<(PKey<Private>, Vec<u8>), ErrorStack> {
    let key = p256_key()?;
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

/// The acmeIdentifier extension of a TLS-ALPN-01 certificate (RFC 8737, section 3).
const ACME_IDENTIFIER_OID: &str = "1.3.6.1.5.5.7.1.31";
/// DER header of the extension's value: an OCTET STRING of the 32-byte SHA-256 digest.
const DIGEST_OCTET_STRING: [u8; 2] = [0x04, 0x20];

/// The self-signed certificate a TLS-ALPN-01 validation must be shown (RFC 8737, section
/// 3): `domain` as its only name, the key authorization's SHA-256 `digest` in a critical
/// acmeIdentifier extension. Valid for a week around now: the CA checks names and
/// extension, not dates, and an order never lasts that long.
fn tls_alpn_answer(domain: &str, digest: &[u8]) -> Result<AcmeTlsAlpnAnswer, ErrorStack> {
    let key = p256_key()?;
    let mut builder = X509::builder()?;
    builder.set_version(2)?;
    let mut serial = BigNum::new()?;
    serial.rand(64, MsbOption::MAYBE_ZERO, false)?;
    builder.set_serial_number(&*serial.to_asn1_integer()?)?;
    let mut name = X509NameBuilder::new()?;
    name.append_entry_by_nid(Nid::COMMONNAME, domain)?;
    let name = name.build();
    builder.set_subject_name(&name)?;
    builder.set_issuer_name(&name)?;
    builder.set_pubkey(&key)?;
    let now = crate::issuer::unix_now();
    builder.set_not_before(&*Asn1Time::from_unix(now - 86_400)?)?;
    builder.set_not_after(&*Asn1Time::from_unix(now + 6 * 86_400)?)?;
    let san = SubjectAlternativeName::new()
        .dns(domain)
        .build(&builder.x509v3_context(None, None))?;
    builder.append_extension(san)?;
    let mut value = DIGEST_OCTET_STRING.to_vec();
    value.extend_from_slice(digest);
    builder.append_extension(X509Extension::new_from_der(
        &*Asn1Object::from_str(ACME_IDENTIFIER_OID)?,
        true,
        &*Asn1OctetString::new_from_bytes(&value)?,
    )?)?;
    builder.sign(&key, MessageDigest::sha256())?;
    let cert_pem = builder.build().to_pem()?;
    let key_pem = key.private_key_to_pem_pkcs8()?;
    Ok(AcmeTlsAlpnAnswer {
        cert_pem: String::from_utf8_lossy(&cert_pem).into_owned(),
        key_pem: String::from_utf8_lossy(&key_pem).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tls_alpn_certificate_names_the_domain_and_carries_the_digest() {
        let digest = [7u8; 32];
        let answer = tls_alpn_answer("shop.example.test", &digest).expect("certificate");
        let cert = X509::from_pem(answer.cert_pem.as_bytes()).expect("PEM");
        let names: Vec<_> = cert
            .subject_alt_names()
            .expect("SAN")
            .iter()
            .filter_map(|n| n.dnsname().map(str::to_string))
            .collect();
        assert_eq!(names, ["shop.example.test"]);
        let key = PKey::private_key_from_pem(answer.key_pem.as_bytes()).expect("key");
        assert!(cert.public_key().expect("public key").public_eq(&key));
        // The extension as a validator reads it: its OID, critical, the digest's DER.
        let der = cert.to_der().expect("DER");
        let mut expected = vec![0x06, 0x08, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x01, 0x1f];
        expected.extend_from_slice(&[0x01, 0x01, 0xff, 0x04, 0x22, 0x04, 0x20]);
        expected.extend_from_slice(&digest);
        assert!(
            der.windows(expected.len()).any(|w| w == expected),
            "no critical acmeIdentifier extension with the digest"
        );
    }
}
