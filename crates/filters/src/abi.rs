//! The proxy-wasm ABI v0.2.1's numbers and its one serialisation (header maps), as the
//! specification (proxy-wasm/spec, `abi-versions/v0.2.1`) and the SDKs define them.

/// What a hostcall returns (`proxy_status_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub(crate) enum Status {
    Ok = 0,
    NotFound = 1,
    BadArgument = 2,
    SerializationFailure = 3,
    InvalidMemoryAccess = 6,
    CasMismatch = 8,
    InternalFailure = 10,
    Unimplemented = 12,
}

/// What a filter's callback answers (`proxy_action_t`).
pub(crate) const ACTION_CONTINUE: i32 = 0;

/// The maps a filter reads and writes (`proxy_map_type_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MapType {
    RequestHeaders,
    RequestTrailers,
    ResponseHeaders,
    ResponseTrailers,
    HttpCallResponseHeaders,
    HttpCallResponseTrailers,
}

impl MapType {
    pub(crate) fn of(value: i32) -> Option<Self> {
        Some(match value {
            0 => MapType::RequestHeaders,
            1 => MapType::RequestTrailers,
            2 => MapType::ResponseHeaders,
            3 => MapType::ResponseTrailers,
            6 => MapType::HttpCallResponseHeaders,
            7 => MapType::HttpCallResponseTrailers,
            _ => return None,
        })
    }
}

/// The buffers a filter reads and writes (`proxy_buffer_type_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BufferType {
    RequestBody,
    ResponseBody,
    HttpCallResponseBody,
    VmConfiguration,
    PluginConfiguration,
}

impl BufferType {
    pub(crate) fn of(value: i32) -> Option<Self> {
        Some(match value {
            0 => BufferType::RequestBody,
            1 => BufferType::ResponseBody,
            4 => BufferType::HttpCallResponseBody,
            6 => BufferType::VmConfiguration,
            7 => BufferType::PluginConfiguration,
            _ => return None,
        })
    }
}

/// The streams `proxy_continue_stream` resumes (`proxy_stream_type_t`).
pub(crate) const STREAM_REQUEST: i32 = 0;
pub(crate) const STREAM_RESPONSE: i32 = 1;

/// A header map as the ABI lays it out: the number of pairs, each pair's key and value
/// lengths, then each key and value followed by a NUL byte; little-endian u32s.
pub(crate) fn encode_map<'a>(pairs: impl Iterator<Item = (&'a [u8], &'a [u8])> + Clone) -> Vec<u8> {
    let count = pairs.clone().count();
    let size: usize = 4 + pairs
        .clone()
        .map(|(k, v)| 8 + k.len() + v.len() + 2)
        .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&(count as u32).to_le_bytes());
    for (key, value) in pairs.clone() {
        out.extend_from_slice(&(key.len() as u32).to_le_bytes());
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    }
    for (key, value) in pairs {
        out.extend_from_slice(key);
        out.push(0);
        out.extend_from_slice(value);
        out.push(0);
    }
    out
}

/// The pairs of a map laid out by [`encode_map`]; `None` when the bytes do not hold one.
pub(crate) fn decode_map(bytes: &[u8]) -> Option<Vec<(&[u8], &[u8])>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let count = u32_at(bytes, 0)? as usize;
    // Each pair takes at least ten bytes: a map cannot claim more pairs than it could hold.
    if count > bytes.len() / 10 {
        return None;
    }
    let mut lengths = Vec::with_capacity(count);
    for i in 0..count {
        let key = u32_at(bytes, 4 + i * 8)? as usize;
        let value = u32_at(bytes, 8 + i * 8)? as usize;
        lengths.push((key, value));
    }
    let mut at = 4 + count * 8;
    let mut pairs = Vec::with_capacity(count);
    for (key_len, value_len) in lengths {
        let key = bytes.get(at..at.checked_add(key_len)?)?;
        at += key_len + 1;
        let value = bytes.get(at..at.checked_add(value_len)?)?;
        at += value_len + 1;
        if at > bytes.len() {
            return None;
        }
        pairs.push((key, value));
    }
    Some(pairs)
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let four = bytes.get(at..at + 4)?;
    Some(u32::from_le_bytes([four[0], four[1], four[2], four[3]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_reads_back_as_written() {
        let pairs: [(&[u8], &[u8]); 2] = [(b":path", b"/a?b"), (b"x-empty", b"")];
        let bytes = encode_map(pairs.iter().copied());
        assert_eq!(decode_map(&bytes), Some(pairs.to_vec()));
    }

    #[test]
    fn a_map_that_claims_more_than_it_holds_is_refused() {
        let mut bytes = encode_map([(&b"k"[..], &b"v"[..])].into_iter());
        bytes[0] = 200;
        assert_eq!(decode_map(&bytes), None);
        let whole = encode_map([(&b"key"[..], &b"value"[..])].into_iter());
        assert_eq!(decode_map(&whole[..whole.len() - 3]), None);
    }
}
