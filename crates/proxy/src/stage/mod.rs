//! The stages of a request, one module each, in the order `crate::pipeline` runs them:
//!
//! 1. `request_id` — the client's id when it looks like one, else a fresh one;
//! 2. `framing` — a body framing no backend could read unambiguously is refused (400), an
//!    upgrade other than WebSocket dropped;
//! 3. `route` — Host (or `:authority`) → app (404, 400, 431, 503 answered here);
//! 4. `acme_challenge` — an HTTP-01 answer the fleet's issuer published in the store, for
//!    its domain, over plain HTTP;
//! 5. `redirects` — the app's moves (a host, a path prefix) answered 301/302/307/308;
//! 6. `app_pages` — the app in maintenance answers 503 with its page; the router's own
//!    502/503/504 for it carry its error pages (HTML to browsers, text to the rest);
//! 7. `limits` — the app's guardrails: allow and deny lists (403), sizes (414, 431, 413),
//!    rates of the client and the app (429), requests in flight (503);
//! 8. `https` — 308 to HTTPS for apps that ask; HSTS on their TLS answers;
//! 9. `basic_auth` — password protection: 401 with `WWW-Authenticate`, the password
//!    checked on the worker pool; 429 after too many failures of one client;
//! 10. `waf` — the request, and a body within the app's limit, inspected on the worker pool
//!     (403, or 503 by the app's overload policy);
//! 11. `static_files` — a file under the app's static root answers GET and HEAD;
//! 12. `cache` — a fresh copy from the app's response cache answers; otherwise the request
//!     holds what the cache needs to keep the app's answer;
//! 13. `images` — `/_img/WxH/…` resized on the worker pool (the pixels: `crate::thumbnail`);
//! 14. `mirror` — a copy starts towards the app's shadow backends, never waited for;
//! 15. `header_rules` — the app's edits to the request's fields; `affinity` — the backend
//!     a sticky-session cookie names is tried first, and a new cookie set when another
//!     served;
//! 16. upstream — `crate::upstream`: a backend is picked, attempted, retried, marked down;
//!     its connection entered in the connection table so a deletion can drain it; then
//!     `header_rules` again, on every answer's fields.
//!
//! A stage reads the request and the [`RequestCtx`](crate::context::RequestCtx) and says
//! whether the request goes on; the listener writes every answer.

pub(crate) mod acme_challenge;
pub(crate) mod affinity;
pub(crate) mod app_pages;
pub(crate) mod basic_auth;
pub(crate) mod cache;
pub(crate) mod compress;
pub(crate) mod framing;
pub(crate) mod header_rules;
pub(crate) mod https;
pub(crate) mod images;
pub(crate) mod limits;
pub(crate) mod mirror;
pub(crate) mod redirects;
pub(crate) mod request_id;
pub(crate) mod route;
pub(crate) mod static_files;
pub(crate) mod waf;
