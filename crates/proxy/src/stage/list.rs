//! The one list of the stages, in the order a request meets them: the only place that order
//! is written. The pipeline runs each app's chain (`stage::chain`, built from this list when
//! the app enters the route cache), `explain` answers stage by stage in this order, and the
//! stage reference (docs/reference/stages.md, with ARCHITECTURE.md's table) is written from
//! it.
//!
//! Phases run one after the other; within a phase, the request's phases (request head,
//! request body, answers in place of the app, upstream request) run the stages in list
//! order, and the answer's phases (answer head, answer body, end) in the reverse order, as
//! Envoy's filter chains decode forwards and encode backwards: the stage nearest the app
//! sees its answer first. A stage is one file of `stage/` and one line here.

/// Where in a request's life a stage takes part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The request's head, read whole, before any of its body.
    RequestHead,
    /// The request's body, before it goes on.
    RequestBody,
    /// An answer the router makes in place of the app's (a file, a cached copy, an image).
    InPlaceOfApp,
    /// The request as it goes to a backend.
    UpstreamRequest,
    /// The app's answer head, before the client gets it.
    AnswerHead,
    /// The app's answer body, as it streams by.
    AnswerBody,
    /// The request is done: logged and counted.
    End,
}

impl Phase {
    pub(crate) const ALL: [Phase; 7] = [
        Phase::RequestHead,
        Phase::RequestBody,
        Phase::InPlaceOfApp,
        Phase::UpstreamRequest,
        Phase::AnswerHead,
        Phase::AnswerBody,
        Phase::End,
    ];

    pub(crate) const fn name(self) -> &'static str {
        match self {
            Phase::RequestHead => "request head",
            Phase::RequestBody => "request body",
            Phase::InPlaceOfApp => "answer in place of the app",
            Phase::UpstreamRequest => "upstream request",
            Phase::AnswerHead => "answer head",
            Phase::AnswerBody => "answer body",
            Phase::End => "end",
        }
    }

    /// Whether the phase runs its stages backwards (the answer's side).
    pub(crate) const fn runs_backwards(self) -> bool {
        matches!(self, Phase::AnswerHead | Phase::AnswerBody | Phase::End)
    }
}

/// Every stage, by name. Its place in [`LIST`] is its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Stage {
    RequestId,
    Framing,
    Route,
    AcmeChallenge,
    FairShare,
    Redirects,
    AppPages,
    Limits,
    Https,
    BasicAuth,
    RequestBuffer,
    Waf,
    Filters,
    StaticFiles,
    Affinity,
    Mirror,
    Cache,
    Images,
    Compress,
    HeaderRules,
    Forwarding,
    Upstream,
    Log,
}

/// What a stage declares of itself: the list's rows.
#[derive(Debug)]
pub(crate) struct Declared {
    pub(crate) stage: Stage,
    /// Its name in `explain`, the reference and the code (`stage/NAME.rs`).
    pub(crate) name: &'static str,
    pub(crate) phases: &'static [Phase],
    /// The app setting that switches it on; `None`: every request needs it.
    pub(crate) switched_on_by: Option<&'static str>,
    /// What it does, in a sentence.
    pub(crate) does: &'static str,
    /// The answers it can make in place of the app's, other than refusals.
    pub(crate) answers: &'static str,
    /// The refusals it can make: their statuses and texts are the refusals' table's
    /// (`respond::Reason::row`).
    pub(crate) refuses: &'static [Reason],
    /// The metrics it counts in.
    pub(crate) metrics: &'static [&'static str],
    /// The names `explain` gives its verdicts on a request (none: not explained per app).
    pub(crate) explained_as: &'static [&'static str],
    /// Whether it reads the request whole (as a map of fields): an HTTP/1.x request's
    /// fields, kept where they were read otherwise, are then made a map first.
    pub(crate) reads_whole_request: bool,
    /// Whether it reads the app's answer fields whole: they are then read into a map. A
    /// stage that only edits fields (compression, header rules, the sticky cookie) edits
    /// them as read (`fields_mut.rs`) and does not set this.
    pub(crate) reads_whole_answer: bool,
}

use crate::respond::Reason;
use Phase::*;

/// A row with the defaults every stage shares.
const ROW: Declared = Declared {
    stage: Stage::Log,
    name: "",
    phases: &[],
    switched_on_by: None,
    does: "",
    answers: "",
    refuses: &[],
    metrics: &[],
    explained_as: &[],
    reads_whole_request: false,
    reads_whole_answer: false,
};

/// The stages, in order.
pub(crate) const LIST: [Declared; 23] = [
    Declared {
        stage: Stage::RequestId,
        name: "request_id",
        phases: &[RequestHead],
        does: "the client's X-Request-Id when it looks like one, else a fresh one; sent to \
               the backend and on every answer",
        ..ROW
    },
    Declared {
        stage: Stage::Framing,
        name: "framing",
        phases: &[RequestHead, UpstreamRequest],
        does: "the body's declared length noted once; a framing no backend could read \
               unambiguously refused, an upgrade other than WebSocket dropped; one framing \
               for the backend",
        refuses: &[Reason::AmbiguousFraming],
        ..ROW
    },
    Declared {
        stage: Stage::Route,
        name: "route",
        phases: &[RequestHead],
        does: "Host (or :authority) to app, exact name then wildcards, from the route cache; \
               the app's chain comes with its route",
        refuses: &[
            Reason::HeadersTooLarge,
            Reason::MissingHost,
            Reason::UnknownHost,
            Reason::RouteUnavailable,
            Reason::UnreadableFields,
        ],
        metrics: &[
            "switchyard_route_cache_hits_total",
            "switchyard_route_cache_misses_total",
        ],
        ..ROW
    },
    Declared {
        stage: Stage::AcmeChallenge,
        name: "acme_challenge",
        phases: &[RequestHead],
        does: "an HTTP-01 answer the fleet's issuer published in the store, for its domain, \
               over plain HTTP",
        answers: "200 (the key authorization)",
        ..ROW
    },
    Declared {
        stage: Stage::FairShare,
        name: "fair_share",
        phases: &[RequestHead],
        does: "while the event loop is saturated, a request of an app above its share of the \
               CPU waits behind the others' (isolation/fair_share.rs); nothing otherwise",
        refuses: &[Reason::OverShare],
        metrics: &[
            "switchyard_fair_share_requests_total",
            "switchyard_fair_share_waiting",
            "switchyard_fair_share_wait_seconds",
        ],
        ..ROW
    },
    Declared {
        stage: Stage::Redirects,
        name: "redirects",
        phases: &[RequestHead],
        switched_on_by: Some("redirects"),
        does: "the app's moves (a host, a path prefix) answered",
        answers: "301, 302, 307, 308",
        explained_as: &["redirects"],
        ..ROW
    },
    Declared {
        stage: Stage::AppPages,
        name: "app_pages",
        phases: &[RequestHead, AnswerHead],
        switched_on_by: Some("maintenance (enabled), error_pages"),
        does: "in maintenance every request is answered with the app's page; the router's \
               own 502, 503 and 504 carry the app's error pages (HTML to browsers, text to \
               the rest)",
        refuses: &[Reason::Maintenance],
        explained_as: &["maintenance", "error_pages"],
        ..ROW
    },
    Declared {
        stage: Stage::Limits,
        name: "limits",
        phases: &[RequestHead, RequestBody, End],
        switched_on_by: Some("limits"),
        does: "the app's guardrails: allow and deny lists, sizes, rates of the client and \
               the app, requests in flight",
        refuses: &[
            Reason::NetworkDenied,
            Reason::TargetTooLong,
            Reason::FieldsTooLargeForApp,
            Reason::BodyTooLarge,
            Reason::AppBusy,
            Reason::ClientBusy,
            Reason::RateLimited,
        ],
        metrics: &[
            "switchyard_limit_decisions_total",
            "switchyard_app_in_flight",
        ],
        explained_as: &["limits"],
        ..ROW
    },
    Declared {
        stage: Stage::Https,
        name: "https",
        phases: &[RequestHead],
        switched_on_by: Some("https_redirect"),
        does: "plain-HTTP requests moved to HTTPS (HSTS and Alt-Svc are on every TLS answer, \
               by the answer writer)",
        answers: "308",
        explained_as: &["https_redirect", "http3"],
        ..ROW
    },
    Declared {
        stage: Stage::BasicAuth,
        name: "basic_auth",
        phases: &[RequestHead],
        switched_on_by: Some("basic_auth"),
        does: "password protection, the password checked on the worker pool (a verified \
               one cached); too many failures of one client locked out",
        refuses: &[
            Reason::Unauthorized,
            Reason::PasswordsLockedOut,
            Reason::PasswordCheckBusy,
        ],
        metrics: &[
            "switchyard_basic_auth_checks_total",
            "switchyard_basic_auth_failing_clients",
        ],
        explained_as: &["basic_auth"],
        ..ROW
    },
    Declared {
        stage: Stage::RequestBuffer,
        name: "request_buffer",
        phases: &[RequestBody],
        switched_on_by: Some("request_buffering (on unless false)"),
        does: "the body read whole (memory, then a spool file) before a backend is chosen, \
               within the budgets and the upload's pace; the backend gets it at once, with \
               its length; 100-continue answered by the router; streaming paths go on as \
               they come; a read that waits too long, a broken body and one past the \
               app's limit are answered as when streamed (upstream's 408, 400, 413)",
        refuses: &[Reason::RequestBufferFull, Reason::UploadTooSlow],
        metrics: &[
            "switchyard_request_buffer_total",
            "switchyard_request_buffer_memory_bytes",
            "switchyard_request_spool_bytes",
        ],
        ..ROW
    },
    Declared {
        stage: Stage::Waf,
        name: "waf",
        phases: &[RequestBody],
        switched_on_by: Some("waf (with the router's --waf on)"),
        does: "the request, and a body within the app's limit, inspected by ModSecurity and \
               the OWASP CRS on the worker pool and held to be sent on",
        refuses: &[
            Reason::WafBlocked,
            Reason::WafOverloaded,
            Reason::WafSpoolUnreadable,
            Reason::WafBodyBroken,
            Reason::WafBodyTimedOut,
        ],
        metrics: &[
            "switchyard_waf_requests_total",
            "switchyard_waf_body_uninspected_total",
        ],
        explained_as: &["waf"],
        reads_whole_request: true,
        ..ROW
    },
    Declared {
        stage: Stage::Filters,
        name: "filters",
        phases: &[RequestHead, RequestBody, AnswerHead, End],
        switched_on_by: Some("filters"),
        does: "the app's proxy-wasm filters, in order: request head, the body read whole \
               (within the app's limit, else 1 MiB), the app's answer head, the log; each \
               callback under a CPU deadline, each instance under a memory cap",
        answers: "what a filter answers with send_local_response",
        refuses: &[Reason::FilterFailed, Reason::FilterBodyTooLarge],
        metrics: &[
            "switchyard_filter_failures_total",
            "switchyard_filter_callbacks_total",
            "switchyard_filter_http_calls_total",
        ],
        explained_as: &["filters"],
        reads_whole_request: true,
        reads_whole_answer: true,
    },
    Declared {
        stage: Stage::StaticFiles,
        name: "static_files",
        phases: &[InPlaceOfApp],
        switched_on_by: Some("static_root"),
        does: "a file under the app's static root answers GET and HEAD",
        answers: "200 (the file)",
        explained_as: &["static"],
        ..ROW
    },
    Declared {
        stage: Stage::Affinity,
        name: "affinity",
        phases: &[RequestHead, UpstreamRequest, AnswerHead],
        switched_on_by: Some("affinity"),
        does: "the backend a sticky-session cookie names is tried first; a new cookie set \
               when another served",
        metrics: &["switchyard_affinity_total"],
        explained_as: &["affinity"],
        ..ROW
    },
    Declared {
        stage: Stage::Mirror,
        name: "mirror",
        phases: &[RequestBody, UpstreamRequest],
        switched_on_by: Some("mirror"),
        does: "a copy of the request starts towards the app's shadow backends, never waited \
               for",
        metrics: &[
            "switchyard_mirror_sent_total",
            "switchyard_mirror_dropped_total",
            "switchyard_mirror_in_flight",
        ],
        explained_as: &["mirror"],
        reads_whole_request: true,
        ..ROW
    },
    Declared {
        stage: Stage::Cache,
        name: "cache",
        phases: &[InPlaceOfApp, UpstreamRequest, AnswerHead, AnswerBody],
        switched_on_by: Some("cache"),
        does: "a fresh copy answers; a stale one is revalidated or stands in for a failing \
               app; the app's answer kept as RFC 9111 allows",
        answers: "the copy (200, 206, 304)",
        metrics: &[
            "switchyard_cache_requests_total",
            "switchyard_cache_stores_total",
            "switchyard_stale_serves_total",
        ],
        explained_as: &["cache"],
        reads_whole_request: true,
        reads_whole_answer: true,
        ..ROW
    },
    Declared {
        stage: Stage::Images,
        name: "images",
        phases: &[InPlaceOfApp],
        switched_on_by: Some("images"),
        does: "`/_img/WxH/…` resized on the worker pool from the app's original",
        answers: "200 (the image)",
        refuses: &[
            Reason::ImageBadRequest,
            Reason::ImagesUnavailable,
            Reason::ImageWorkersBusy,
            Reason::ImageUnprocessable,
            Reason::ImageOriginalUnreadable,
            Reason::ImageOriginalRefused,
            Reason::ImageOriginalCut,
        ],
        metrics: &["switchyard_image_requests_total"],
        explained_as: &["images"],
        reads_whole_request: true,
        ..ROW
    },
    Declared {
        stage: Stage::Compress,
        name: "compress",
        phases: &[RequestHead, AnswerHead, AnswerBody],
        switched_on_by: Some("compress"),
        does: "answers of the app's types compressed as the client prefers (zstd, br, gzip), \
               streamed",
        metrics: &["switchyard_compress_total", "switchyard_compress_streams"],
        explained_as: &["compress"],
        ..ROW
    },
    Declared {
        stage: Stage::HeaderRules,
        name: "header_rules",
        phases: &[UpstreamRequest, AnswerHead],
        switched_on_by: Some("headers"),
        does: "the app's edits to its requests' fields and to every answer's",
        explained_as: &["header_rules"],
        ..ROW
    },
    Declared {
        stage: Stage::Forwarding,
        name: "forwarding",
        phases: &[UpstreamRequest],
        does: "X-Forwarded-For, -Proto, -Port, X-Request-Id, X-Request-Start and Via for the \
               backend; the PROXY protocol when the app asks",
        explained_as: &["forwarding"],
        ..ROW
    },
    Declared {
        stage: Stage::Upstream,
        name: "upstream",
        phases: &[UpstreamRequest, AnswerHead, AnswerBody],
        does: "a backend picked (balancer, health), its pooled connection, retries, the \
               answer read ahead of a slow client",
        refuses: &[
            Reason::NoBackends,
            Reason::NoHealthyBackend,
            Reason::UpstreamFailed,
            Reason::UpstreamTimedOut,
            Reason::UnaskedUpgrade,
            Reason::ClientBodyTimedOut,
            Reason::ClientBodyBroken,
            Reason::ClientBodyTooLarge,
        ],
        metrics: &[
            "switchyard_upstream_errors_total",
            "switchyard_upstream_retries_total",
            "switchyard_responses_read_ahead_total",
        ],
        explained_as: &["response_buffering"],
        ..ROW
    },
    Declared {
        stage: Stage::Log,
        name: "log",
        phases: &[End],
        does: "one access-log line, the request counted and timed",
        metrics: &[
            "switchyard_requests_total",
            "switchyard_request_duration_seconds",
        ],
        ..ROW
    },
];

/// The row `stage` declares.
#[cfg(test)]
pub(crate) fn declared(stage: Stage) -> &'static Declared {
    // The list holds each stage once, in its enum's order (a unit test keeps it so).
    &LIST[stage as usize]
}

/// The list as a Markdown table, one row a stage in order: the stage reference and
/// ARCHITECTURE.md's table are this text.
pub fn stages_table() -> String {
    let cell = |text: &str| {
        text.split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .replace('|', "\\|")
    };
    let mut out = String::from(
        "| # | stage | phases | switched on by | what it does | answers | metrics | in explain |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for (place, row) in LIST.iter().enumerate() {
        let phases: Vec<&str> = row.phases.iter().map(|p| p.name()).collect();
        let metrics: Vec<String> = row.metrics.iter().map(|m| format!("`{m}`")).collect();
        let or_dash = |text: String| {
            if text.is_empty() {
                "–".to_string()
            } else {
                text
            }
        };
        let explained: Vec<String> = row.explained_as.iter().map(|e| format!("`{e}`")).collect();
        let mut answers: Vec<String> = Vec::new();
        if !row.answers.is_empty() {
            answers.push(cell(row.answers));
        }
        answers.extend(row.refuses.iter().map(|reason| {
            let refusal = reason.row();
            format!("{} `{}`", refusal.status, refusal.label)
        }));
        out.push_str(&format!(
            "| {} | `{}` | {} | {} | {} | {} | {} | {} |\n",
            place + 1,
            row.name,
            phases.join(", "),
            row.switched_on_by
                .map_or("every request".to_string(), |s| format!("`{}`", cell(s))),
            cell(row.does),
            or_dash(answers.join(", ")),
            or_dash(metrics.join(", ")),
            or_dash(explained.join(", ")),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stage_sits_at_its_own_place_once() {
        for (place, row) in LIST.iter().enumerate() {
            assert_eq!(row.stage as usize, place, "{} out of place", row.name);
            assert!(!row.name.is_empty() && !row.does.is_empty(), "{}", row.name);
            assert!(
                !row.phases.is_empty(),
                "{} takes part in no phase",
                row.name
            );
        }
    }

    #[test]
    fn every_refusal_is_made_by_one_stage_or_before_any() {
        // Made before a request exists: by the HTTP/1 head's reader and HTTP/3's 0-RTT check
        // (the route stage checks the head's size again for HTTP/2 and HTTP/3).
        let before_any = [Reason::MalformedHead, Reason::TooEarly];
        for reason in Reason::all() {
            let makers: Vec<&str> = LIST
                .iter()
                .filter(|row| row.refuses.contains(&reason))
                .map(|row| row.name)
                .collect();
            if before_any.contains(&reason) {
                assert!(makers.is_empty(), "{reason:?} listed by {makers:?}");
            } else {
                assert_eq!(makers.len(), 1, "{reason:?} listed by {makers:?}");
            }
        }
    }

    #[test]
    fn every_metric_a_stage_names_is_exported() {
        let exported: Vec<String> = crate::metric_docs().into_iter().map(|m| m.name).collect();
        for row in &LIST {
            for metric in row.metrics {
                let named = exported.iter().any(|name| name == metric);
                assert!(named, "{}: {metric} is no metric", row.name);
            }
        }
    }

    #[test]
    fn stages_every_request_needs_are_the_few_the_issue_names() {
        let always: Vec<&str> = LIST
            .iter()
            .filter(|row| row.switched_on_by.is_none())
            .map(|row| row.name)
            .collect();
        assert_eq!(
            always,
            [
                "request_id",
                "framing",
                "route",
                "acme_challenge",
                // Every request is admitted by it, though it only ever makes one wait while
                // its event loop is saturated (isolation/fair_share.rs).
                "fair_share",
                "forwarding",
                "upstream",
                "log"
            ]
        );
    }
}
