//! The TOML config file of `switchyard serve`: any text is either accepted or refused with a
//! message that names the file, never a panic.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use switchyard_config::{Config, ServeArgs};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("fuzzed.toml");
    if let Err(error) = Config::resolve_with_file(ServeArgs::default(), path, text) {
        let message = format!("{error:#}");
        // Every refusal points at what to fix: the file (with a line for a bad value) or,
        // for settings that only make sense together, the setting.
        assert!(
            message.contains("fuzzed.toml")
                || message.contains("default_key")
                || message.contains("admin-token"),
            "{message}"
        );
    }
});
