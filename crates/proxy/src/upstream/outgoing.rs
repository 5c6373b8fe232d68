//! A request on its way to the app as the upstream sends it: its head, the fields that go
//! on as read and the stages' edits of them, and how its answer's fields are handed back.

use std::cell::Cell;

use crate::fields_mut::FieldEdits;
use crate::forwarded::Forwarding;
use crate::proxy_protocol::Announced;
use crate::request_body::Held;
use crate::request_fields::RequestFields;

use super::forward_body::ClientBodyFailure;

/// A request on its way to the app, as the upstream sends it.
pub(crate) struct Outgoing<'a> {
    /// The head as the backend gets it (origin form, one framing).
    pub(crate) head: &'a http::request::Parts,
    /// An HTTP/1.x client's fields as read, written on as they came, when `head` has no map.
    pub(crate) as_read: Option<&'a RequestFields>,
    /// The stages' edits of fields as read, made as the backend's head is written (a map's
    /// were made on it).
    pub(crate) edits: RequestEdits<'a>,
    pub(crate) forwarding: &'a Forwarding,
    /// What opens its connection, for an app that asks for the PROXY protocol: the
    /// connection is then the client connection's own.
    pub(crate) announced: Option<Announced>,
    /// Whether the answer's fields are made a map or go on as read.
    pub(crate) answer_form: AnswerForm,
    /// Whether the request may be sent again after a failure: idempotent, not an upgrade,
    /// its body all in hand (none, or read whole for the WAF).
    pub(crate) repeatable: bool,
    /// The body in hand, sent again on a retry.
    pub(crate) replay: Option<&'a Held>,
    /// Where the body tells how the client's side of it failed (`ForwardBody::failures_into`).
    pub(crate) client_failure: &'a Cell<Option<ClientBodyFailure>>,
}

/// What the app's stages change in an HTTP/1.x client's fields as read.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RequestEdits<'a> {
    /// The app's request rules.
    pub(crate) rules: Option<&'a FieldEdits>,
    /// For an app that compresses, the one coding the backend is offered in place of the
    /// client's `Accept-Encoding` (`Some(None)`: none, the field left out).
    pub(crate) accept_encoding: Option<Option<&'static str>>,
}

/// How an answer's fields are handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AnswerForm {
    /// In the response's `HeaderMap`: for the stages that read the answer's fields (the
    /// cache) and for HTTP/2 clients, whose server takes a map.
    Map,
    /// As read, in the body (`BackendBody::take_fields`): for an HTTP/1.x client when no
    /// stage reads them. Building the map, and walking it to write the client's head,
    /// cost more than parsing the head (callgrind); a 101 still comes in a map, for the
    /// relay.
    AsRead,
}
