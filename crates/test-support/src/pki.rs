//! Certificates made in the test: a CA, optional intermediates, and leaves for any names and
//! validity window, generated with OpenSSL (EC P-256, fast enough to make dozens per test).

use std::time::{SystemTime, UNIX_EPOCH};

use openssl::asn1::{Asn1Integer, Asn1Time};
use openssl::bn::BigNum;
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::x509::extension::{BasicConstraints, KeyUsage, SubjectAlternativeName};
use openssl::x509::{X509Name, X509};

const DAY: i64 = 86_400;

/// A certificate authority that can issue leaves and intermediates.
pub struct Ca {
    pub cert: X509,
    key: PKey<Private>,
}

/// A leaf (with the chain to send after it) and its key, as PEM.
pub struct Issued {
    /// Leaf first, then intermediates.
    pub cert_pem: String,
    pub key_pem: String,
    /// SHA-256 of the leaf, to recognise it in a handshake.
    pub fingerprint: Vec<u8>,
}

fn new_key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).expect("P-256");
    PKey::from_ec_key(EcKey::generate(&group).expect("EC key")).expect("pkey")
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

fn name(common_name: &str) -> X509Name {
    let mut name = X509Name::builder().expect("name");
    name.append_entry_by_nid(Nid::COMMONNAME, common_name)
        .expect("CN");
    name.build()
}

fn serial() -> Asn1Integer {
    let mut bn = BigNum::new().expect("bignum");
    bn.rand(64, openssl::bn::MsbOption::MAYBE_ZERO, false)
        .expect("random serial");
    bn.to_asn1_integer().expect("serial")
}

pub fn fingerprint(cert: &X509) -> Vec<u8> {
    cert.digest(MessageDigest::sha256())
        .expect("digest")
        .to_vec()
}

impl Ca {
    /// A self-signed root.
    pub fn root(common_name: &str) -> Self {
        let key = new_key();
        let cert = Self::build(common_name, &key, None, true, &[], -1, 365);
        Self { cert, key }
    }

    /// An intermediate CA signed by this one.
    pub fn intermediate(&self, common_name: &str) -> Ca {
        let key = new_key();
        let cert = Self::build(common_name, &key, Some(self), true, &[], -1, 365);
        Ca { cert, key }
    }

    /// A leaf for `names`, valid from `from_days` to `to_days` relative to now.
    pub fn issue(&self, names: &[&str], from_days: i64, to_days: i64) -> Issued {
        self.issue_with_chain(names, from_days, to_days, &[])
    }

    /// A leaf whose PEM carries `chain` after it (intermediates, in the order given).
    pub fn issue_with_chain(
        &self,
        names: &[&str],
        from_days: i64,
        to_days: i64,
        chain: &[&X509],
    ) -> Issued {
        let key = new_key();
        let cert = Self::build(names[0], &key, Some(self), false, names, from_days, to_days);
        let mut cert_pem = String::from_utf8(cert.to_pem().expect("pem")).expect("utf8");
        for extra in chain {
            cert_pem.push_str(&String::from_utf8(extra.to_pem().expect("pem")).expect("utf8"));
        }
        Issued {
            cert_pem,
            key_pem: String::from_utf8(key.private_key_to_pem_pkcs8().expect("key pem"))
                .expect("utf8"),
            fingerprint: fingerprint(&cert),
        }
    }

    pub fn pem(&self) -> String {
        String::from_utf8(self.cert.to_pem().expect("pem")).expect("utf8")
    }

    fn build(
        common_name: &str,
        key: &PKey<Private>,
        issuer: Option<&Ca>,
        is_ca: bool,
        names: &[&str],
        from_days: i64,
        to_days: i64,
    ) -> X509 {
        let mut builder = X509::builder().expect("builder");
        builder.set_version(2).expect("v3");
        builder.set_serial_number(&serial()).expect("serial");
        let subject = name(common_name);
        builder.set_subject_name(&subject).expect("subject");
        builder
            .set_issuer_name(issuer.map_or(&subject, |ca| ca.cert.subject_name()))
            .expect("issuer");
        builder.set_pubkey(key).expect("pubkey");
        builder
            .set_not_before(&Asn1Time::from_unix(now() + from_days * DAY).expect("time"))
            .expect("not before");
        builder
            .set_not_after(&Asn1Time::from_unix(now() + to_days * DAY).expect("time"))
            .expect("not after");
        if is_ca {
            builder
                .append_extension(BasicConstraints::new().critical().ca().build().expect("bc"))
                .expect("bc");
            builder
                .append_extension(
                    KeyUsage::new()
                        .key_cert_sign()
                        .crl_sign()
                        .build()
                        .expect("ku"),
                )
                .expect("ku");
        } else {
            let mut san = SubjectAlternativeName::new();
            for n in names {
                san.dns(n);
            }
            let san = san
                .build(&builder.x509v3_context(issuer.map(|ca| &*ca.cert), None))
                .expect("san");
            builder.append_extension(san).expect("san");
        }
        let signing_key = issuer.map_or(key, |ca| &ca.key);
        builder
            .sign(signing_key, MessageDigest::sha256())
            .expect("sign");
        builder.build()
    }
}
