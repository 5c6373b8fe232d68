//! An external authorisation check: before the app, the filter calls the tenant's auth
//! service (`proxy_http_call` to an upstream the router knows by name) with the client's
//! Authorization field; a 200 lets the request through with the service's `x-user` as a
//! field, anything else is answered 401 (503 when the service cannot be reached).
//! Configuration (JSON): `{"upstream": "auth-app", "path": "/check", "timeout_ms": 1000}`.

use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    upstream: String,
    #[serde(default = "check")]
    path: String,
    #[serde(default = "second")]
    timeout_ms: u64,
}

fn check() -> String {
    "/check".into()
}

fn second() -> u64 {
    1000
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(AuthRoot { config: None }) });
}}

struct AuthRoot {
    config: Option<Rc<Config>>,
}

impl Context for AuthRoot {}

impl RootContext for AuthRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let config = self.get_plugin_configuration().unwrap_or_default();
        match serde_json::from_slice::<Config>(&config) {
            Ok(config) => {
                self.config = Some(Rc::new(config));
                true
            }
            Err(_) => false,
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let config = self.config.clone()?;
        Some(Box::new(AuthCall { config }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct AuthCall {
    config: Rc<Config>,
}

impl HttpContext for AuthCall {
    fn on_http_request_headers(&mut self, _fields: usize, _end_of_stream: bool) -> Action {
        let authorization = self
            .get_http_request_header("authorization")
            .unwrap_or_default();
        let upstream = self.config.upstream.clone();
        let dispatched = self.dispatch_http_call(
            &upstream,
            vec![
                (":method", "GET"),
                (":path", &self.config.path),
                (":authority", &upstream),
                ("authorization", &authorization),
            ],
            None,
            vec![],
            Duration::from_millis(self.config.timeout_ms),
        );
        match dispatched {
            Ok(_) => Action::Pause,
            Err(_) => {
                self.send_http_response(503, vec![], Some(b"the auth service cannot be called\n"));
                Action::Pause
            }
        }
    }
}

impl Context for AuthCall {
    fn on_http_call_response(
        &mut self,
        _token: u32,
        _fields: usize,
        _body: usize,
        _trailers: usize,
    ) {
        match self.get_http_call_response_header(":status").as_deref() {
            Some("200") => {
                let user = self.get_http_call_response_header("x-user");
                self.set_http_request_header("x-user", user.as_deref());
                self.resume_http_request();
            }
            Some(_) => {
                self.send_http_response(
                    401,
                    vec![("www-authenticate", "Bearer")],
                    Some(b"401 Unauthorized\n"),
                );
            }
            None => {
                self.send_http_response(503, vec![], Some(b"the auth service did not answer\n"));
            }
        }
    }
}
