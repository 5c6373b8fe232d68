//! ACME Renewal Information (RFC 9773): the window in which the CA suggests renewing a
//! certificate, asked for by the certificate's identifier (its authority key identifier and
//! serial number, each base64url).

use std::borrow::Cow;

use instant_acme::{Account, CertificateIdentifier};
use openssl::x509::X509;

/// The CA's suggested renewal window for the leaf of `cert_pem`, as seconds since the
/// epoch; `None` when the CA offers no renewal information.
pub(crate) async fn window(
    account: &Account,
    cert_pem: &str,
) -> Result<Option<(i64, i64)>, String> {
    let id = certificate_id(cert_pem)?;
    match account.renewal_info(&id).await {
        Ok((info, _retry_after)) => Ok(Some((
            info.suggested_window.start.unix_timestamp(),
            info.suggested_window.end.unix_timestamp(),
        ))),
        Err(instant_acme::Error::Unsupported(_)) => Ok(None),
        Err(e) => Err(format!("renewal information: {e}")),
    }
}

/// The ARI identifier of the leaf (the first certificate) of `cert_pem`.
fn certificate_id(cert_pem: &str) -> Result<CertificateIdentifier<'static>, String> {
    let leaf = X509::from_pem(cert_pem.as_bytes()).map_err(|e| format!("the certificate: {e}"))?;
    let key_id = leaf
        .authority_key_id()
        .ok_or("the certificate has no authority key identifier")?;
    let serial = leaf
        .serial_number()
        .to_bn()
        .map(|n| n.to_vec())
        .map_err(|e| format!("the serial number: {e}"))?;
    Ok(identifier(key_id.as_slice(), &serial))
}

/// From the key identifier's bytes and the serial number's magnitude (big-endian): the
/// serial is base64url'd as DER encodes it, with a leading zero when its top bit is set.
fn identifier(key_id: &[u8], serial: &[u8]) -> CertificateIdentifier<'static> {
    let mut encoded_serial = Vec::with_capacity(serial.len() + 1);
    if serial.first().is_none_or(|b| b & 0x80 != 0) {
        encoded_serial.push(0);
    }
    encoded_serial.extend_from_slice(serial);
    CertificateIdentifier {
        authority_key_identifier: Cow::Owned(base64url(key_id)),
        serial: Cow::Owned(base64url(&encoded_serial)),
    }
}

fn base64url(bytes: &[u8]) -> String {
    openssl::base64::encode_block(bytes)
        .trim_end_matches('=')
        .chars()
        .map(|c| match c {
            '+' => '-',
            '/' => '_',
            c => c,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::identifier;

    #[test]
    fn identifiers_are_built_as_rfc_9773_shows() {
        // RFC 9773, section 4.1: keyIdentifier 69:88:5B:…:D4, serial 00:87:65:43:21.
        let key_id = [
            0x69, 0x88, 0x5B, 0x6B, 0x87, 0x46, 0x40, 0x41, 0xE1, 0xB3, 0x7B, 0x84, 0x7B, 0xA0,
            0xAE, 0x2C, 0xDE, 0x01, 0xC8, 0xD4,
        ];
        let id = identifier(&key_id, &[0x87, 0x65, 0x43, 0x21]);
        assert_eq!(id.to_string(), "aYhba4dGQEHhs3uEe6CuLN4ByNQ.AIdlQyE");
        assert_eq!(
            identifier(&[1], &[0x7f]).serial,
            "fw",
            "no zero before a clear top bit"
        );
    }
}
