//! A test fixture, not an example to follow: a filter that does, on request, what a
//! tenant's broken or hostile filter might, so the tests can show the host stays up and
//! the other apps unharmed. Configuration: one word.
//! - `spin`: loops forever in `on_http_request_headers` (the CPU deadline stops it);
//! - `grow`: allocates without end (the memory cap stops it);
//! - `trap`: panics;
//! - `pause`: pauses with nothing to resume it;
//! - `echo`: puts what the host tells it (properties, shared data, ticks seen) in request
//!   fields, and upper-cases the request body and the answer's;
//! - `configure-fails`: refuses its configuration.

use std::cell::Cell;
use std::time::Duration;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { mode: String::new() }) });
}}

thread_local! {
    static TICKS: Cell<u64> = const { Cell::new(0) };
}

struct Root {
    mode: String,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let config = self.get_plugin_configuration().unwrap_or_default();
        self.mode = String::from_utf8_lossy(&config)
            .trim()
            .trim_matches('"')
            .to_string();
        if self.mode == "echo" {
            self.set_tick_period(Duration::from_millis(20));
        }
        self.mode != "configure-fails"
    }

    fn on_tick(&mut self) {
        TICKS.with(|t| t.set(t.get() + 1));
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Filter {
            mode: self.mode.clone(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Filter {
    mode: String,
}

impl Context for Filter {}

fn property(filter: &Filter, path: &str) -> String {
    let path: Vec<&str> = path.split('.').collect();
    match filter.get_property(path) {
        Some(bytes) if bytes.len() == 8 && !bytes.iter().all(u8::is_ascii_graphic) => {
            u64::from_le_bytes(bytes.try_into().unwrap_or_default()).to_string()
        }
        Some(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        None => "-".into(),
    }
}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, _fields: usize, _end_of_stream: bool) -> Action {
        match self.mode.as_str() {
            "spin" => {
                let mut n: u64 = 0;
                loop {
                    n = n.wrapping_add(std::hint::black_box(1));
                    if std::hint::black_box(n) == u64::MAX {
                        break;
                    }
                }
                Action::Continue
            }
            "grow" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "trap" => panic!("a filter that panics"),
            "pause" => Action::Pause,
            "echo" => {
                for name in [
                    "request.path",
                    "request.host",
                    "request.method",
                    "source.address",
                    "source.port",
                    "plugin_name",
                    "route_name",
                    "request.id",
                ] {
                    let value = property(self, name);
                    self.set_http_request_header(
                        &format!("x-echo-{}", name.replace('.', "-").replace('_', "-")),
                        Some(&value),
                    );
                }
                let (seen, cas) = self.get_shared_data("requests");
                let count = seen.map_or(0, |b| {
                    String::from_utf8_lossy(&b).parse::<u64>().unwrap_or(0)
                }) + 1;
                let _ = self.set_shared_data("requests", Some(count.to_string().as_bytes()), cas);
                self.set_http_request_header("x-echo-count", Some(&count.to_string()));
                self.set_http_request_header(
                    "x-echo-ticks",
                    Some(&TICKS.with(Cell::get).to_string()),
                );
                let all = self.get_http_request_headers().len();
                self.add_http_request_header("x-echo-fields", &all.to_string());
                Action::Continue
            }
            _ => Action::Continue,
        }
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if self.mode != "echo" || !end_of_stream {
            return Action::Continue;
        }
        if let Some(body) = self.get_http_request_body(0, size) {
            self.set_http_request_body(0, size, &body.to_ascii_uppercase());
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if self.mode != "echo" || !end_of_stream {
            return Action::Continue;
        }
        if let Some(body) = self.get_http_response_body(0, size) {
            self.set_http_response_body(0, size, &body.to_ascii_uppercase());
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _fields: usize, _end_of_stream: bool) -> Action {
        if self.mode == "echo" {
            let status = self.get_http_response_header(":status").unwrap_or_default();
            self.set_http_response_header("x-echo-status", Some(&status));
            self.set_http_response_header("server", None);
            // Paused: the body is wanted (it is upper-cased) before the head goes on.
            return Action::Pause;
        }
        Action::Continue
    }
}
