//! The stages of a request, one module each. Their order, the phases each takes part in and
//! the setting that switches each on are written once, in [`list`]; an app's [`chain`] is
//! built from it when the app enters the route cache, and `crate::pipeline` runs that chain
//! phase by phase. The reference (docs/reference/stages.md) is made from the same list.
//!
//! A stage reads the request and the [`RequestCtx`](crate::context::RequestCtx) and says
//! whether the request goes on; `pipeline::answer` writes every answer.
//!
//! A new stage: its file here, its row in [`list::LIST`], the setting that switches it on in
//! `chain::switched_on`, and its arm in the pipeline's phase it takes part in.

pub(crate) mod acme_challenge;
pub(crate) mod affinity;
pub(crate) mod app_pages;
pub(crate) mod basic_auth;
pub(crate) mod cache;
pub(crate) mod chain;
pub(crate) mod compress;
pub(crate) mod filters;
pub(crate) mod framing;
pub(crate) mod header_rules;
pub(crate) mod https;
pub(crate) mod images;
pub(crate) mod limits;
pub(crate) mod list;
pub(crate) mod mirror;
pub(crate) mod redirects;
pub(crate) mod request_buffer;
pub(crate) mod request_id;
pub(crate) mod route;
pub(crate) mod static_files;
pub(crate) mod waf;
