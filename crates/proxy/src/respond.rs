//! Every answer the router makes itself instead of the app's, in one table: each stage that
//! stops a request says why with a [`Reason`], and [`Reason::row`] alone gives that reason
//! its status, its text, the label the access log and `switchyard_refusals_total` name it
//! by, and the app's page it takes; `pipeline::answer` writes it, and the two answers made
//! before a request exists (a refused HTTP/1 head, HTTP/3's 425) are written from the same
//! row. As linkerd2-proxy's `errors/respond.rs` maps its errors, no stage names a status.
//! Bodies are short and carry no internal detail, only the request id.

use std::borrow::Cow;

/// Why the router answers a request itself instead of the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    // The head, before any app is known.
    /// The HTTP/1 head breaks the grammar or the framing rules (RFC 9112).
    MalformedHead,
    /// The request's head exceeds the router's budget.
    HeadersTooLarge,
    /// An HTTP/3 request in 0-RTT data that is not safe to replay.
    TooEarly,
    // route
    /// The request has no usable Host header.
    MissingHost,
    /// No app owns the Host.
    UnknownHost,
    /// The route could not be looked up (store unavailable, nothing cached).
    RouteUnavailable,
    /// The request's body framing cannot be forwarded unambiguously.
    AmbiguousFraming,
    /// The fields kept as read could not be made into a map for a stage that reads them.
    UnreadableFields,
    // fair_share
    /// The app is above its share of a saturated router's CPU and waited its turn too long
    /// (or the queue was full).
    OverShare,
    // limits
    /// The app does not accept the client's network.
    NetworkDenied,
    /// The request target is longer than the app allows.
    TargetTooLong,
    /// The request's fields are larger than the app allows.
    FieldsTooLargeForApp,
    /// The body is larger than the app's `max_body_bytes`.
    BodyTooLarge,
    /// The app has as many requests in progress as it allows.
    AppBusy,
    /// This client has as many requests in progress to the app as it allows.
    ClientBusy,
    /// The app's request rate is spent for now.
    RateLimited,
    // app_pages
    /// The app is in maintenance.
    Maintenance,
    // basic_auth
    /// The app asks for a user name and password.
    Unauthorized,
    /// Too many failed passwords from this client.
    PasswordsLockedOut,
    /// The password could not be checked in time.
    PasswordCheckBusy,
    // waf
    /// The app's WAF blocked the request.
    WafBlocked,
    /// The WAF could not inspect in time and the app fails closed.
    WafOverloaded,
    /// The body the WAF spooled could not be read back.
    WafSpoolUnreadable,
    /// The body broke while the WAF read it.
    WafBodyBroken,
    /// The body did not come in time for the WAF.
    WafBodyTimedOut,
    // filters
    /// One of the app's filters failed (trapped, ran past its deadline or its memory, is
    /// not stored) and it fails closed.
    FilterFailed,
    /// The body is larger than the app's filters may read (the app's `max_body_bytes`, or
    /// 1 MiB).
    FilterBodyTooLarge,
    // images
    /// The resize asked for cannot be made (its parameters).
    ImageBadRequest,
    /// Image resizing is not running on this router.
    ImagesUnavailable,
    /// The image workers are busy, or the resize missed its deadline.
    ImageWorkersBusy,
    /// The original cannot be resized (too large, not an image).
    ImageUnprocessable,
    /// The original could not be read from the static root.
    ImageOriginalUnreadable,
    /// The app answered something else than 200 for the original: its status is passed on.
    ImageOriginalRefused,
    /// The container was removed while it sent the original.
    ImageOriginalCut,
    // request_buffer
    /// The memory or spool budget of request buffering has no room for the body.
    RequestBufferFull,
    /// The upload fell behind its minimum pace, or passed its whole-body deadline.
    UploadTooSlow,
    // the client's body on its way to the app
    /// Nothing of the body came within the body deadline.
    ClientBodyTimedOut,
    /// The body broke: a malformed chunk, a reset.
    ClientBodyBroken,
    /// The body passed the app's `max_body_bytes` while it was sent on.
    ClientBodyTooLarge,
    // upstream
    /// The app exists but has no backends.
    NoBackends,
    /// The app has backends but none is usable.
    NoHealthyBackend,
    /// The app gave no usable answer.
    UpstreamFailed,
    /// The app did not answer in time.
    UpstreamTimedOut,
    /// The backend switched protocols though the client did not ask.
    UnaskedUpgrade,
}

/// Which of the app's pages stands in for the router's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Page {
    /// The app's page for the status, when it has one.
    OfStatus,
    /// The app's maintenance page.
    Maintenance,
}

/// What a reason answers: one row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) status: u16,
    pub(crate) text: &'static str,
    /// The access log's `refused` and `switchyard_refusals_total`'s `reason`.
    pub(crate) label: &'static str,
    /// `Retry-After`, for refusals that ask the client to come back.
    pub(crate) retry_after_s: Option<u32>,
    pub(crate) page: Page,
}

const fn row(status: u16, label: &'static str, text: &'static str) -> Row {
    Row {
        status,
        text,
        label,
        retry_after_s: None,
        page: Page::OfStatus,
    }
}

const fn come_back(mut row: Row, seconds: u32) -> Row {
    row.retry_after_s = Some(seconds);
    row
}

/// The refusals' table: each reason's status, text, label, `Retry-After` and page, in the
/// order the reasons are declared (a unit test holds it to that: `row` indexes it).
const TABLE: [(Reason, Row); 44] = [
    (
        Reason::MalformedHead,
        row(400, "malformed_head", "bad request"),
    ),
    (
        Reason::HeadersTooLarge,
        row(431, "headers_too_large", "request headers too large"),
    ),
    (
        Reason::TooEarly,
        row(
            425,
            "too_early",
            "too early: sent before the handshake ended; send it again",
        ),
    ),
    (
        Reason::MissingHost,
        row(400, "missing_host", "the request has no valid Host header"),
    ),
    (
        Reason::UnknownHost,
        row(404, "unknown_host", "no app is configured for this host"),
    ),
    (
        Reason::RouteUnavailable,
        row(
            503,
            "route_unavailable",
            "routing is temporarily unavailable",
        ),
    ),
    (
        Reason::AmbiguousFraming,
        row(
            400,
            "ambiguous_framing",
            "the request body's framing is ambiguous",
        ),
    ),
    (
        Reason::UnreadableFields,
        row(400, "unreadable_fields", "bad request"),
    ),
    (
        Reason::OverShare,
        come_back(
            row(
                503,
                "over_share",
                "this app is using more than its share of the router, try again shortly",
            ),
            1,
        ),
    ),
    (
        Reason::NetworkDenied,
        row(
            403,
            "network_denied",
            "forbidden: this app does not accept your network",
        ),
    ),
    (
        Reason::TargetTooLong,
        row(
            414,
            "target_too_long",
            "the request target is too long for this app",
        ),
    ),
    (
        Reason::FieldsTooLargeForApp,
        row(
            431,
            "fields_too_large",
            "the request headers are too large for this app",
        ),
    ),
    (
        Reason::BodyTooLarge,
        row(
            413,
            "body_too_large",
            "the request body is too large for this app",
        ),
    ),
    (
        Reason::AppBusy,
        come_back(
            row(
                503,
                "app_busy",
                "this app has too many requests in progress",
            ),
            1,
        ),
    ),
    (
        Reason::ClientBusy,
        come_back(
            row(
                429,
                "client_busy",
                "too many requests in progress from you to this app",
            ),
            1,
        ),
    ),
    (
        Reason::RateLimited,
        come_back(row(429, "rate_limited", "too many requests"), 1),
    ),
    (
        Reason::Maintenance,
        Row {
            page: Page::Maintenance,
            ..row(
                503,
                "maintenance",
                "this app is under maintenance, try again later",
            )
        },
    ),
    (
        Reason::Unauthorized,
        row(
            401,
            "unauthorized",
            "this app asks for a user name and password",
        ),
    ),
    (
        Reason::PasswordsLockedOut,
        row(
            429,
            "passwords_locked_out",
            "too many failed passwords, try again later",
        ),
    ),
    (
        Reason::PasswordCheckBusy,
        come_back(
            row(
                503,
                "password_check_busy",
                "the password could not be checked in time, try again shortly",
            ),
            POOL_BUSY_RETRY_AFTER_S,
        ),
    ),
    (
        Reason::WafBlocked,
        row(
            403,
            "waf_blocked",
            "request blocked by the web application firewall",
        ),
    ),
    (
        Reason::WafOverloaded,
        come_back(
            row(
                503,
                "waf_overloaded",
                "request inspection is overloaded, try again shortly",
            ),
            POOL_BUSY_RETRY_AFTER_S,
        ),
    ),
    (
        Reason::WafSpoolUnreadable,
        row(
            500,
            "waf_spool_unreadable",
            "the request could not be completed",
        ),
    ),
    (
        Reason::WafBodyBroken,
        row(400, "waf_body_broken", "bad request"),
    ),
    (
        Reason::WafBodyTimedOut,
        row(408, "waf_body_timed_out", "request timeout"),
    ),
    (
        Reason::FilterFailed,
        row(500, "filter_failed", "the app's filter failed"),
    ),
    (
        Reason::FilterBodyTooLarge,
        row(
            413,
            "filter_body_too_large",
            "the request body is too large for the app's filters",
        ),
    ),
    (
        Reason::ImageBadRequest,
        row(400, "image_bad_request", "bad image request"),
    ),
    (Reason::ImagesUnavailable, {
        row(503, "images_unavailable", "image resizing is not available")
    }),
    (
        Reason::ImageWorkersBusy,
        come_back(
            row(
                503,
                "image_workers_busy",
                "the image workers are busy, try again shortly",
            ),
            POOL_BUSY_RETRY_AFTER_S,
        ),
    ),
    (Reason::ImageUnprocessable, {
        row(422, "image_unprocessable", "the image cannot be resized")
    }),
    (Reason::ImageOriginalUnreadable, {
        row(500, "image_original_unreadable", "cannot read the original")
    }),
    (
        Reason::ImageOriginalRefused,
        row(
            502,
            "image_original_refused",
            "the app did not answer the original",
        ),
    ),
    (
        Reason::ImageOriginalCut,
        row(
            502,
            "image_original_cut",
            "the app's container was removed while sending the original",
        ),
    ),
    (
        Reason::RequestBufferFull,
        come_back(
            row(
                503,
                "request_buffer_full",
                "the router has no room for this request body now, try again shortly",
            ),
            5,
        ),
    ),
    (
        Reason::UploadTooSlow,
        row(
            408,
            "upload_too_slow",
            "request timeout: the upload was too slow",
        ),
    ),
    (
        Reason::ClientBodyTimedOut,
        row(408, "client_body_timed_out", "request timeout"),
    ),
    (
        Reason::ClientBodyBroken,
        row(400, "client_body_broken", "bad request"),
    ),
    (
        Reason::ClientBodyTooLarge,
        row(
            413,
            "client_body_too_large",
            "the request body is too large for this app",
        ),
    ),
    (
        Reason::NoBackends,
        row(503, "no_backends", "this app has no running containers"),
    ),
    (
        Reason::NoHealthyBackend,
        row(
            502,
            "no_healthy_backend",
            "no container of this app is reachable",
        ),
    ),
    (
        Reason::UpstreamFailed,
        row(502, "upstream_failed", "the app did not answer correctly"),
    ),
    (Reason::UpstreamTimedOut, {
        row(504, "upstream_timed_out", "the app did not answer in time")
    }),
    (
        Reason::UnaskedUpgrade,
        row(502, "unasked_upgrade", "the app did not answer correctly"),
    ),
];

impl Reason {
    /// Every reason, in the table's order.
    pub(crate) fn all() -> impl Iterator<Item = Reason> {
        TABLE.iter().map(|(reason, _)| *reason)
    }

    /// The one place a refusal's status, text, label, `Retry-After` and page are chosen:
    /// its row of the table.
    pub(crate) const fn row(self) -> Row {
        TABLE[self as usize].1
    }

    pub(crate) const fn label(self) -> &'static str {
        self.row().label
    }

    /// The app gave no usable answer: timed out, or not.
    pub(crate) const fn upstream_failed(timed_out: bool) -> Self {
        if timed_out {
            Self::UpstreamTimedOut
        } else {
            Self::UpstreamFailed
        }
    }
}

/// An answer of the router's own instead of the app's: a stage refused the request, or the
/// app could not be reached. The one type every stage stops a request with: a reason, and
/// what this request adds to its row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) reason: Reason,
    /// A text made for this request (a limit's numbers, an image's size) instead of the
    /// row's.
    text: Option<Cow<'static, str>>,
    /// The row's `Retry-After`, or this request's (a rate limit's wait, a lock-out's).
    pub(crate) retry_after_s: Option<u32>,
    /// The app's own status passed on (the images stage's original), instead of the row's.
    apps_status: Option<u16>,
}

impl Refusal {
    pub(crate) const fn new(reason: Reason) -> Self {
        Self {
            reason,
            text: None,
            retry_after_s: reason.row().retry_after_s,
            apps_status: None,
        }
    }

    /// A refusal whose text is made for this request.
    pub(crate) fn explained(reason: Reason, text: String) -> Self {
        Self {
            text: Some(Cow::Owned(text)),
            ..Self::new(reason)
        }
    }

    /// The app gave no usable answer: timed out, or not.
    pub(crate) const fn upstream_failed(timed_out: bool) -> Self {
        Self::new(Reason::upstream_failed(timed_out))
    }

    /// The client is asked to come back in `seconds`.
    pub(crate) const fn come_back_in(mut self, seconds: u32) -> Self {
        self.retry_after_s = Some(seconds);
        self
    }

    /// The app's `status` goes on to the client in place of the row's (an error status the
    /// app gave for an image's original).
    pub(crate) fn with_apps_status(mut self, status: u16) -> Self {
        if (400..600).contains(&status) {
            self.apps_status = Some(status);
        }
        self
    }

    /// A server error that asks nobody to come back: the app failed, or could not be
    /// reached, and a stale copy may stand in (RFC 5861's stale-if-error).
    pub(crate) fn is_failure(&self) -> bool {
        self.status() >= 500 && self.retry_after_s.is_none()
    }

    pub(crate) fn status(&self) -> u16 {
        self.apps_status.unwrap_or(self.reason.row().status)
    }

    pub(crate) fn text(&self) -> &str {
        self.text.as_deref().unwrap_or(self.reason.row().text)
    }
}

impl From<switchyard_h1::RequestError> for Reason {
    /// A head the HTTP/1 reader refused: 431 for its size, 400 for everything else it
    /// breaks; the connection closes after either.
    fn from(error: switchyard_h1::RequestError) -> Self {
        match error {
            switchyard_h1::RequestError::HeadTooLarge => Self::HeadersTooLarge,
            _ => Self::MalformedHead,
        }
    }
}

impl From<Reason> for Refusal {
    fn from(reason: Reason) -> Self {
        Self::new(reason)
    }
}

/// Seconds a client is asked to wait after the worker pool refused its request (busy, or
/// its deadline would pass): the WAF's and the images stage's `Retry-After`.
pub(crate) const POOL_BUSY_RETRY_AFTER_S: u32 = 1;

/// Largest piece of a response body written at once: the client send timeout is a deadline
/// for each piece, so a large cached answer is not held to the deadline of a small one.
pub(crate) const BODY_PIECE: usize = 64 * 1024;

/// The body of an answer the router makes itself: short, with nothing internal but the
/// request id.
pub(crate) fn error_body(status: u16, text: &str, request_id: Option<&str>) -> String {
    match request_id {
        Some(id) => format!("{status} {text}\nrequest id: {id}\n"),
        // Before a request exists (a refused head): no id to give.
        None => format!("{status} {text}\n"),
    }
}

/// The refusals' table in Markdown, for `docs/reference/refusals.md`.
pub fn refusals_table() -> String {
    let mut table = String::from(
        "| reason (access log `refused`, metric label) | status | text | Retry-After | app's page |\n|---|---|---|---|---|\n",
    );
    for reason in Reason::all() {
        let row = reason.row();
        // The app's settings hold pages for 502, 503 and 504 (switchyard_model::ErrorPages).
        let page = match row.page {
            Page::Maintenance => "`maintenance.page_html`".to_string(),
            Page::OfStatus if (502..=504).contains(&row.status) => {
                format!("`error_pages.\"{}\"`", row.status)
            }
            Page::OfStatus => "–".to_string(),
        };
        table.push_str(&format!(
            "| `{}` | {} | {} | {} | {page} |\n",
            row.label,
            row.status,
            row.text,
            row.retry_after_s
                .map_or("–".to_string(), |s| format!("{s} s")),
        ));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_one_row_and_its_own_label() {
        // The table holds every reason once, in the order they are declared.
        for (index, (reason, _)) in TABLE.iter().enumerate() {
            assert_eq!(
                *reason as usize, index,
                "{reason:?} out of place in the table"
            );
        }
        assert_eq!(TABLE.len(), Reason::UnaskedUpgrade as usize + 1);
        let mut labels: Vec<&str> = Reason::all().map(Reason::label).collect();
        let listed = labels.len();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(
            labels.len(),
            listed,
            "a label is used twice, or a reason listed twice"
        );
        for reason in Reason::all() {
            let row = reason.row();
            assert!(
                (400..600).contains(&row.status),
                "{reason:?}: {}",
                row.status
            );
            assert!(!row.text.is_empty(), "{reason:?} has no text");
        }
    }

    #[test]
    fn a_refusal_takes_its_rows_values_unless_the_request_made_its_own() {
        let plain = Refusal::new(Reason::AppBusy);
        assert_eq!((plain.status(), plain.retry_after_s), (503, Some(1)));
        assert_eq!(plain.text(), "this app has too many requests in progress");
        let waited = Refusal::explained(Reason::RateLimited, "wait".into()).come_back_in(7);
        assert_eq!((waited.status(), waited.text()), (429, "wait"));
        assert_eq!(waited.retry_after_s, Some(7));
        let passed_on = Refusal::new(Reason::ImageOriginalRefused).with_apps_status(404);
        assert_eq!(passed_on.status(), 404);
        let not_an_error = Refusal::new(Reason::ImageOriginalRefused).with_apps_status(301);
        assert_eq!(not_an_error.status(), 502);
    }
}
