//! Records as JSON text, a record that does not round-trip reported as corrupt under its key.

use crate::StoreError;

pub(crate) fn encode<T: serde::Serialize>(key: &str, value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt {
        key: key.to_string(),
        reason: e.to_string(),
    })
}

pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    key: &str,
    text: &str,
) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt {
        key: key.to_string(),
        reason: e.to_string(),
    })
}
