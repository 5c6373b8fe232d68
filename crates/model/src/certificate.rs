//! TLS certificates as operators upload them: a PEM chain and its private key for one domain
//! (or a `*.example.com` wildcard). Everything is checked here once, at the API, so the
//! handshake path can trust what the store hands it.

use openssl::asn1::{Asn1Time, Asn1TimeRef};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::PKey;
use openssl::x509::{X509NameRef, X509VerifyResult, X509};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::{as_object, optional_bool, refuse_unknown};
use crate::{Domain, ValidationError};

/// Longest PEM accepted for a chain or a key: a long chain with big RSA keys stays far below.
const MAX_PEM_BYTES: usize = 64 * 1024;
/// Most certificates in one chain (leaf and intermediates).
const MAX_CHAIN_LEN: usize = 8;

/// A validated certificate with its key, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredCertificate {
    /// What the certificate is served for.
    pub domain: Domain,
    /// Leaf first, then intermediates, PEM.
    pub cert_pem: String,
    /// The leaf's private key, PEM.
    pub key_pem: String,
    /// Facts about the leaf, for listings and expiry alerts.
    pub info: CertificateInfo,
}

/// What may be shown about a stored certificate: never the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CertificateInfo {
    /// The domain it is stored under.
    pub domain: String,
    /// The leaf's subject, e.g. `CN=shop.example.com`.
    pub subject: String,
    /// The leaf's issuer, e.g. `CN=R11, O=Let's Encrypt, C=US`.
    pub issuer: String,
    /// DNS names the leaf covers.
    pub names: Vec<String>,
    /// Start of validity, seconds since the Unix epoch.
    pub not_before: i64,
    /// End of validity, seconds since the Unix epoch.
    pub not_after: i64,
    /// SHA-256 of the leaf in DER, hex, to tell two uploads apart.
    pub sha256: String,
}

/// The body of `PUT /v1/certs/{domain}`, as the admin API's OpenAPI document describes it;
/// [`parse_certificate_spec`] reads it field by field, to name the one at fault.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CertificateUpload {
    /// The leaf first, then its intermediates, PEM.
    pub cert_pem: String,
    /// The leaf's private key, PEM (RSA, ECDSA or Ed25519).
    pub key_pem: String,
    /// Stores a certificate outside its validity (for tests and clocks gone wrong).
    #[serde(default)]
    pub allow_expired: bool,
}

/// The fields of [`CertificateUpload`].
const UPLOAD_FIELDS: [&str; 3] = ["cert_pem", "key_pem", "allow_expired"];

/// Parses and validates the body of `PUT /v1/certs/{domain}`:
/// `{"cert_pem": …, "key_pem": …, "allow_expired": false}`.
///
/// Refused with the field at fault: a PEM that does not parse, a key that is not the
/// certificate's, a chain out of order, a certificate that does not cover `domain`, or one
/// outside its validity at `now_unix` (unless `allow_expired`).
pub fn parse_certificate_spec(
    domain: &str,
    body: &Value,
    now_unix: i64,
) -> Result<StoredCertificate, ValidationError> {
    let domain = Domain::parse(domain).map_err(|m| ValidationError::new("domain", m))?;
    let fields = as_object(body, "")?;
    refuse_unknown(fields, &UPLOAD_FIELDS, "")?;
    let cert_pem = pem_field(fields.get("cert_pem"), "cert_pem")?;
    let key_pem = pem_field(fields.get("key_pem"), "key_pem")?;
    let allow_expired = optional_bool(fields, "allow_expired", false)?;

    let chain = parse_chain(cert_pem)?;
    let leaf = &chain[0];
    let key = PKey::private_key_from_pem(key_pem.as_bytes()).map_err(|_| {
        ValidationError::new(
            "key_pem",
            "is not an unencrypted PEM private key (RSA, EC or Ed25519)",
        )
    })?;
    let leaf_key = leaf.public_key().map_err(|_| {
        ValidationError::new("cert_pem", "the certificate's public key is unreadable")
    })?;
    if !leaf_key.public_eq(&key) {
        let owner = chain
            .iter()
            .skip(1)
            .position(|c| c.public_key().map(|p| p.public_eq(&key)).unwrap_or(false));
        if let Some(i) = owner {
            return Err(ValidationError::new(
                "cert_pem",
                format!(
                    "the chain is out of order: the key belongs to certificate {}; put the \
                     leaf (the certificate of key_pem) first, then each issuer",
                    i + 1
                ),
            ));
        }
        return Err(ValidationError::new(
            "key_pem",
            "does not match the certificate (the first certificate of cert_pem)",
        ));
    }
    check_chain_order(&chain)?;

    let names = dns_names(leaf);
    if !names.iter().any(|n| covers(n, domain.as_str())) {
        return Err(ValidationError::new(
            "domain",
            format!(
                "the certificate does not cover '{domain}'; it names {}",
                if names.is_empty() {
                    "no DNS name".to_string()
                } else {
                    names.join(", ")
                }
            ),
        ));
    }
    let not_before = unix_time(leaf.not_before())?;
    let not_after = unix_time(leaf.not_after())?;
    if !allow_expired {
        if now_unix > not_after {
            return Err(ValidationError::new(
                "cert_pem",
                format!(
                    "the certificate expired on {} (set \"allow_expired\": true to store it anyway)",
                    leaf.not_after()
                ),
            ));
        }
        if now_unix < not_before {
            return Err(ValidationError::new(
                "cert_pem",
                format!(
                    "the certificate is not valid before {} (set \"allow_expired\": true to store it anyway)",
                    leaf.not_before()
                ),
            ));
        }
    }
    let sha256 = leaf
        .digest(MessageDigest::sha256())
        .map(|d| d.iter().map(|b| format!("{b:02x}")).collect())
        .map_err(|_| ValidationError::new("cert_pem", "cannot fingerprint the certificate"))?;
    let info = CertificateInfo {
        domain: domain.to_string(),
        subject: name_text(leaf.subject_name()),
        issuer: name_text(leaf.issuer_name()),
        names,
        not_before,
        not_after,
        sha256,
    };
    Ok(StoredCertificate {
        domain,
        cert_pem: cert_pem.to_string(),
        key_pem: key_pem.to_string(),
        info,
    })
}

/// Whether a certificate name (`shop.example.com` or `*.example.com`) covers `domain`, itself
/// exact or a wildcard. A wildcard name covers exactly one label, as TLS clients check it.
pub fn covers(cert_name: &str, domain: &str) -> bool {
    let cert_name = cert_name.to_ascii_lowercase();
    if cert_name == domain {
        return true;
    }
    match (cert_name.strip_prefix("*."), domain.split_once('.')) {
        (Some(suffix), Some((label, rest))) => label != "*" && rest == suffix,
        _ => false,
    }
}

fn pem_field<'a>(value: Option<&'a Value>, field: &str) -> Result<&'a str, ValidationError> {
    let text = value
        .ok_or_else(|| ValidationError::new(field, "is required"))?
        .as_str()
        .ok_or_else(|| ValidationError::new(field, "must be a PEM string"))?;
    if text.len() > MAX_PEM_BYTES {
        return Err(ValidationError::new(
            field,
            format!("is larger than {MAX_PEM_BYTES} bytes"),
        ));
    }
    Ok(text)
}

fn parse_chain(pem: &str) -> Result<Vec<X509>, ValidationError> {
    let chain = X509::stack_from_pem(pem.as_bytes())
        .map_err(|_| ValidationError::new("cert_pem", "is not a PEM certificate chain"))?;
    if chain.is_empty() {
        return Err(ValidationError::new(
            "cert_pem",
            "contains no certificate (expected -----BEGIN CERTIFICATE-----)",
        ));
    }
    if chain.len() > MAX_CHAIN_LEN {
        return Err(ValidationError::new(
            "cert_pem",
            format!("has more than {MAX_CHAIN_LEN} certificates"),
        ));
    }
    Ok(chain)
}

/// Each certificate must be issued (and signed) by the next one: leaf first, root last or
/// omitted. Clients given a shuffled chain fail in ways that are hard to trace back.
fn check_chain_order(chain: &[X509]) -> Result<(), ValidationError> {
    for (i, pair) in chain.windows(2).enumerate() {
        let (child, issuer) = (&pair[0], &pair[1]);
        let signed = issuer
            .public_key()
            .and_then(|key| child.verify(&key))
            .unwrap_or(false);
        if issuer.issued(child) != X509VerifyResult::OK || !signed {
            return Err(ValidationError::new(
                "cert_pem",
                format!(
                    "the chain is out of order: certificate {} ({}) did not issue certificate {} ({}); \
                     put the leaf first, then each issuer",
                    i + 1,
                    name_text(issuer.subject_name()),
                    i,
                    name_text(child.subject_name()),
                ),
            ));
        }
    }
    Ok(())
}

/// The leaf's DNS subject alternative names, or its common name when it has none.
fn dns_names(leaf: &X509) -> Vec<String> {
    let from_san: Vec<String> = leaf
        .subject_alt_names()
        .map(|names| {
            names
                .iter()
                .filter_map(|n| n.dnsname().map(|d| d.to_ascii_lowercase()))
                .collect()
        })
        .unwrap_or_default();
    if !from_san.is_empty() {
        return from_san;
    }
    leaf.subject_name()
        .entries_by_nid(Nid::COMMONNAME)
        .filter_map(|e| e.data().to_string().ok().map(|s| s.to_ascii_lowercase()))
        .collect()
}

fn name_text(name: &X509NameRef) -> String {
    name.entries()
        .map(|entry| {
            let key = entry.object().nid().short_name().unwrap_or("?");
            let value = entry.data().to_string().unwrap_or_default();
            format!("{key}={value}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn unix_time(time: &Asn1TimeRef) -> Result<i64, ValidationError> {
    unix_seconds(time)
        .ok_or_else(|| ValidationError::new("cert_pem", "cannot read the validity dates"))
}

/// A certificate's time (its `notBefore` or `notAfter`) in seconds since the epoch.
pub fn unix_seconds(time: &Asn1TimeRef) -> Option<i64> {
    let diff = Asn1Time::from_unix(0).ok()?.diff(time).ok()?;
    Some(i64::from(diff.days) * 86_400 + i64::from(diff.secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_upload_has_the_fields_the_parser_takes() {
        let schema =
            serde_json::to_value(schemars::schema_for!(CertificateUpload)).expect("schema");
        let mut documented: Vec<&str> = schema["properties"]
            .as_object()
            .expect("properties")
            .keys()
            .map(String::as_str)
            .collect();
        documented.sort_unstable();
        let mut parsed = UPLOAD_FIELDS.to_vec();
        parsed.sort_unstable();
        assert_eq!(documented, parsed);
    }

    #[test]
    fn wildcard_names_cover_one_label() {
        assert!(covers("shop.example.com", "shop.example.com"));
        assert!(covers("*.example.com", "shop.example.com"));
        assert!(covers("*.example.com", "*.example.com"));
        assert!(!covers("*.example.com", "a.shop.example.com"));
        assert!(!covers("*.example.com", "example.com"));
        assert!(!covers("shop.example.com", "*.example.com"));
    }
}
