//! A tenant's header policy: fields a request must carry (400 without them), request fields
//! removed before the app sees them, answer fields set and removed before the client sees
//! them. Configuration (JSON):
//! `{"require": ["x-api-key"], "remove_request": ["x-debug"],
//!   "set_response": {"x-frame-options": "DENY"}, "remove_response": ["server"]}`

use std::collections::BTreeMap;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use serde::Deserialize;

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Policy {
    #[serde(default)]
    require: Vec<String>,
    #[serde(default)]
    remove_request: Vec<String>,
    #[serde(default)]
    set_response: BTreeMap<String, String>,
    #[serde(default)]
    remove_response: Vec<String>,
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(PolicyRoot::default()) });
}}

#[derive(Default)]
struct PolicyRoot {
    policy: Rc<Policy>,
}

impl Context for PolicyRoot {}

impl RootContext for PolicyRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let Some(config) = self.get_plugin_configuration() else {
            return true;
        };
        match serde_json::from_slice::<Policy>(&config) {
            Ok(policy) => {
                self.policy = Rc::new(policy);
                true
            }
            Err(e) => {
                proxy_wasm::hostcalls::log(LogLevel::Error, &format!("bad configuration: {e}"))
                    .ok();
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(PolicyFilter {
            policy: self.policy.clone(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct PolicyFilter {
    policy: Rc<Policy>,
}

impl Context for PolicyFilter {}

impl HttpContext for PolicyFilter {
    fn on_http_request_headers(&mut self, _fields: usize, _end_of_stream: bool) -> Action {
        for name in &self.policy.require {
            if self.get_http_request_header(name).is_none() {
                let body = format!("the request must carry {name}\n");
                self.send_http_response(
                    400,
                    vec![("content-type", "text/plain")],
                    Some(body.as_bytes()),
                );
                return Action::Pause;
            }
        }
        for name in &self.policy.remove_request {
            self.set_http_request_header(name, None);
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _fields: usize, _end_of_stream: bool) -> Action {
        for name in &self.policy.remove_response {
            self.set_http_response_header(name, None);
        }
        for (name, value) in &self.policy.set_response {
            self.set_http_response_header(name, Some(value));
        }
        Action::Continue
    }
}
