//! `proxy_get_shared_data` and `proxy_set_shared_data`: a key-value table per router, one
//! namespace per app (a tenant's filter never reads another tenant's keys), with the
//! ABI's compare-and-swap. Routers of a fleet share nothing through it: each has its own.
//! Bounded: at most [`MAX_KEYS_PER_APP`] keys and [`MAX_VALUE_BYTES`] a value; a write
//! past either is refused (the SDKs turn that into a failed filter).

use std::collections::HashMap;

use parking_lot::Mutex;

/// Keys an app's filters may keep.
pub const MAX_KEYS_PER_APP: usize = 1024;
/// Bytes of one value.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

/// One app's keys: each value with its version (the ABI's CAS).
type AppTable = HashMap<Vec<u8>, (Vec<u8>, u32)>;

#[derive(Default)]
pub(crate) struct SharedData {
    apps: Mutex<HashMap<String, AppTable>>,
}

/// Why a write was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    CasMismatch,
    Full,
}

impl SharedData {
    pub(crate) fn get(&self, app: &str, key: &[u8]) -> Option<(Vec<u8>, u32)> {
        self.apps.lock().get(app)?.get(key).cloned()
    }

    /// Sets `key`; `cas` 0 writes whatever is there, another value only over that version.
    pub(crate) fn set(&self, app: &str, key: &[u8], value: &[u8], cas: u32) -> Result<(), Refused> {
        if value.len() > MAX_VALUE_BYTES {
            return Err(Refused::Full);
        }
        let mut apps = self.apps.lock();
        let table = apps.entry(app.to_string()).or_default();
        let next = match table.get(key) {
            Some((_, version)) if cas != 0 && cas != *version => return Err(Refused::CasMismatch),
            Some((_, version)) => version.wrapping_add(1).max(1),
            None if cas != 0 => return Err(Refused::CasMismatch),
            None if table.len() >= MAX_KEYS_PER_APP => return Err(Refused::Full),
            None => 1,
        };
        table.insert(key.to_vec(), (value.to_vec(), next));
        Ok(())
    }

    /// Keys held over every app (the metric).
    pub(crate) fn keys(&self) -> usize {
        self.apps.lock().values().map(HashMap::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apps_do_not_see_each_others_keys_and_cas_guards_writes() {
        let data = SharedData::default();
        data.set("a", b"k", b"1", 0).expect("first write");
        assert_eq!(data.get("b", b"k"), None);
        let (value, cas) = data.get("a", b"k").expect("written");
        assert_eq!(value, b"1");
        data.set("a", b"k", b"2", cas)
            .expect("with the current version");
        assert_eq!(data.set("a", b"k", b"3", cas), Err(Refused::CasMismatch));
    }

    #[test]
    fn an_app_cannot_keep_more_than_its_keys() {
        let data = SharedData::default();
        for i in 0..MAX_KEYS_PER_APP {
            data.set("a", i.to_string().as_bytes(), b"", 0)
                .expect("room");
        }
        assert_eq!(data.set("a", b"one more", b"", 0), Err(Refused::Full));
        data.set("b", b"one more", b"", 0)
            .expect("another app's room");
    }
}
