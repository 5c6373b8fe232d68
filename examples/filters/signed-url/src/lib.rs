//! Signed URLs: a request passes only with `expires` (Unix seconds, not past) and `sig`,
//! the hex HMAC-SHA256 under the tenant's secret of `PATH\nEXPIRES`; any other is answered
//! 403 by the filter itself, before the app. Configuration (JSON):
//! `{"secret": "…", "prefix": "/private/"}` (paths outside the prefix pass).

use std::rc::Rc;
use std::time::UNIX_EPOCH;

use hmac::{Hmac, Mac};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use serde::Deserialize;
use sha2::Sha256;

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    secret: String,
    #[serde(default = "everything")]
    prefix: String,
}

fn everything() -> String {
    "/".into()
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(SignedRoot::default()) });
}}

#[derive(Default)]
struct SignedRoot {
    config: Rc<Config>,
}

impl Context for SignedRoot {}

impl RootContext for SignedRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let config = self.get_plugin_configuration().unwrap_or_default();
        match serde_json::from_slice::<Config>(&config) {
            Ok(config) if !config.secret.is_empty() => {
                self.config = Rc::new(config);
                true
            }
            _ => false,
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(SignedUrl {
            config: self.config.clone(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct SignedUrl {
    config: Rc<Config>,
}

impl Context for SignedUrl {}

impl SignedUrl {
    fn refuse(&mut self, why: &str) -> Action {
        self.send_http_response(
            403,
            vec![("content-type", "text/plain")],
            Some(format!("403 Forbidden: {why}\n").as_bytes()),
        );
        Action::Pause
    }
}

impl HttpContext for SignedUrl {
    fn on_http_request_headers(&mut self, _fields: usize, _end_of_stream: bool) -> Action {
        let target = self.get_http_request_header(":path").unwrap_or_default();
        let (path, query) = target.split_once('?').unwrap_or((target.as_str(), ""));
        if !path.starts_with(&self.config.prefix) {
            return Action::Continue;
        }
        let param = |name: &str| {
            query
                .split('&')
                .find_map(|pair| {
                    pair.strip_prefix(name)
                        .and_then(|rest| rest.strip_prefix('='))
                })
                .map(str::to_string)
        };
        let (Some(expires), Some(sig)) = (param("expires"), param("sig")) else {
            return self.refuse("the URL is not signed");
        };
        let now = self
            .get_current_time()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        match expires.parse::<u64>() {
            Ok(at) if at >= now => {}
            _ => return self.refuse("the URL has expired"),
        }
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(self.config.secret.as_bytes()) else {
            return self.refuse("no key");
        };
        mac.update(format!("{path}\n{expires}").as_bytes());
        let Some(given) = decode_hex(&sig) else {
            return self.refuse("the signature is not hex");
        };
        if mac.verify_slice(&given).is_err() {
            return self.refuse("the signature does not match");
        }
        Action::Continue
    }
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}
