//! Why a host goes where it goes: the answer of `GET /v1/explain` and `switchyard explain`.
//! Read from this router's own routing view, the one its requests use — the same domain
//! matching, the same stages and the same backend state — without changing any of it (the
//! round-robin cursor is read, not advanced).

use switchyard_model::{
    normalize_host, App, BackendView, Balancer, DomainRule, Explanation, NextBackend, StageVerdict,
};
use switchyard_store::StoreError;

use crate::response_cache::redis::CacheRedis;
use crate::routing::balancer::{BackendState, Upstream};
use crate::routing::route_cache::{wildcard_parents, DomainMatch, RouteCache};
use crate::stage::cache;

/// Explains `host` (as a client would send it, port allowed) and `path` for `method`;
/// `cache_redis`: where apps with the shared store keep their copies.
pub async fn explain(
    routes: &RouteCache,
    cache_redis: Option<&CacheRedis>,
    host: &str,
    path: &str,
    method: &str,
) -> Result<Explanation, StoreError> {
    let Some(normalized) = normalize_host(host) else {
        return Ok(Explanation::unserved(
            host.to_string(),
            Vec::new(),
            "not a host name an app can own (an IP literal, or not a valid name): 400 or 404"
                .to_string(),
        ));
    };
    let Some((matched, name)) = routes.matching_domain(&normalized).await? else {
        let tried = tried_domains(&normalized, None);
        return Ok(Explanation::unserved(
            normalized,
            tried,
            "no app owns this host or a wildcard above it: 404".to_string(),
        ));
    };
    let Some(route) = routes.app(&name).await? else {
        return Ok(Explanation::unserved(
            normalized,
            Vec::new(),
            format!("the domain names app '{name}', which was deleted a moment ago: 404"),
        ));
    };
    let (rule, domain) = match &matched {
        DomainMatch::Exact => (DomainRule::Exact, normalized.clone()),
        DomainMatch::Wildcard(domain) => (DomainRule::Wildcard, domain.clone()),
    };
    Ok(Explanation {
        tried: tried_domains(&normalized, Some(&domain)),
        stages: stages(&route.app, &normalized, method, path),
        stored: cache::stored_copies(&route, cache_redis, &normalized, path).await,
        backend: Some(next_backend(&route.upstream, &route.app)),
        host: normalized,
        path: Some(path.to_string()),
        method: Some(method.to_string()),
        app: Some(name.to_string()),
        rule: Some(rule),
        domain: Some(domain),
        why: None,
    })
}

/// The stored domains looked up for `host`, in order, up to the one that matched.
fn tried_domains(host: &str, matched: Option<&str>) -> Vec<String> {
    let candidates = std::iter::once(host.to_string())
        .chain(wildcard_parents(host).map(|parent| format!("*.{parent}")));
    let mut tried = Vec::new();
    for candidate in candidates {
        let done = matched == Some(candidate.as_str());
        tried.push(candidate);
        if done {
            break;
        }
    }
    tried
}

/// Each stage, in the order requests run them, and whether it acts on this request.
fn stages(app: &App, host: &str, method: &str, path: &str) -> Vec<StageVerdict> {
    let reads = method == "GET" || method == "HEAD";
    let mut stages = Vec::new();
    let mut stage = |stage: &'static str, applies: bool, why: String| {
        stages.push(StageVerdict {
            stage,
            applies,
            why,
        });
    };
    let (path_only, query) = path
        .split_once('?')
        .map_or((path, None), |(p, q)| (p, Some(q)));
    let moved = app
        .redirects
        .iter()
        .find_map(|r| Some((r.status, r.location(host, path_only, query)?)));
    match (app.redirects.len(), moved) {
        (0, _) => stage("redirects", false, "the app lists no redirects".into()),
        (_, Some((status, location))) => stage(
            "redirects",
            true,
            format!("answered {status} to {location}"),
        ),
        (n, None) => stage(
            "redirects",
            false,
            format!("none of the app's {n} redirects takes this host and path"),
        ),
    }
    match app.maintenance.as_deref() {
        Some(m) if m.enabled => stage(
            "maintenance",
            true,
            format!(
                "in maintenance: every request is answered 503 ({}){}, the backends are not asked",
                if m.page_html.is_some() {
                    "the app's page to browsers, text to the rest"
                } else {
                    "the router's text"
                },
                m.retry_after_s
                    .map(|s| format!(" with Retry-After: {s}"))
                    .unwrap_or_default()
            ),
        ),
        _ => stage("maintenance", false, "the app is not in maintenance".into()),
    }
    match app.error_pages.as_deref() {
        Some(pages) if !pages.0.is_empty() => stage(
            "error_pages",
            true,
            format!(
                "the router's own {} for this app carry the app's page (to browsers)",
                pages
                    .0
                    .keys()
                    .map(u16::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        _ => stage("error_pages", false, "the router's own pages".into()),
    }
    match &app.limits {
        Some(limits) => stage(
            "limits",
            true,
            format!(
                "guardrails apply: {}",
                serde_json::to_string(limits).unwrap_or_default()
            ),
        ),
        None => stage("limits", false, "the app sets no limits".into()),
    }
    match app.basic_auth.as_deref() {
        Some(auth) if auth.is_open(path_only) => stage(
            "basic_auth",
            false,
            "the path is open: no password asked".into(),
        ),
        Some(auth) => stage(
            "basic_auth",
            true,
            format!(
                "a user name and password are asked (realm \"{}\", {} users): 401 without",
                auth.realm,
                auth.users.len()
            ),
        ),
        None => stage("basic_auth", false, "the app asks no password".into()),
    }
    match app.headers.as_deref() {
        Some(rules) => stage(
            "header_rules",
            true,
            format!(
                "request: {}; response: {}",
                serde_json::to_string(&rules.request).unwrap_or_default(),
                serde_json::to_string(&rules.response).unwrap_or_default()
            ),
        ),
        None => stage("header_rules", false, "the app edits no fields".into()),
    }
    match &app.affinity {
        Some(affinity) => stage(
            "affinity",
            true,
            format!(
                "sticky sessions: the backend the cookie {} names is tried first while it is \
                 in the app and usable; a first request, or one whose backend is gone, gets a \
                 new cookie ({})",
                affinity.cookie,
                affinity
                    .ttl_s
                    .map_or("a session cookie".to_string(), |s| format!("Max-Age={s}"))
            ),
        ),
        None => stage("affinity", false, "requests are balanced one by one".into()),
    }
    match &app.compress {
        Some(compress) => stage(
            "compress",
            true,
            format!(
                "answers of {} from {} bytes compressed (zstd, br or gzip, as the client \
                 prefers), streamed; one cached copy per coding",
                compress.types.join(", "),
                compress.min_bytes
            ),
        ),
        None => stage("compress", false, "answers go as the app sends them".into()),
    }
    stage(
        "forwarding",
        true,
        format!(
            "the app gets X-Forwarded-For, -Proto, -Port, X-Request-Id, X-Request-Start and Via{}{}",
            if app.forwarding.x_forwarded_host {
                ", and X-Forwarded-Host"
            } else {
                ""
            },
            match app.forwarding.proxy_protocol {
                Some(version) => format!(
                    "; each connection to a backend opens with a PROXY protocol v{} header \
                     naming the client, and carries that client connection's requests only",
                    u8::from(version)
                ),
                None => String::new(),
            }
        ),
    );
    stage(
        "https_redirect",
        app.https_redirect,
        if app.https_redirect {
            "plain-HTTP requests get 308 to HTTPS; HTTPS ones go on".into()
        } else {
            "off: plain HTTP is served".into()
        },
    );
    match crate::stage::https::advertised_http3() {
        Some(alt_svc) if app.advertise_http3 => stage(
            "http3",
            true,
            format!("HTTPS answers carry Alt-Svc: {alt_svc}; browsers move to HTTP/3"),
        ),
        Some(_) => stage(
            "http3",
            false,
            "advertise_http3 is false: no Alt-Svc, clients stay on TCP".into(),
        ),
        None => stage(
            "http3",
            false,
            "the router serves no HTTP/3 (--http3)".into(),
        ),
    }
    stage(
        "response_buffering",
        app.response_buffering,
        if app.response_buffering {
            "answers not in hand with their head are read ahead of slow clients (but \
             text/event-stream and X-Accel-Buffering: no)"
                .into()
        } else {
            "off: answers stream at the client's pace".into()
        },
    );
    match &app.waf {
        Some(waf) => stage(
            "waf",
            true,
            format!(
                "inspected on the worker pool ({:?} mode, paranoia {}, bodies up to {} bytes, {} ms, on overload {:?})",
                waf.mode, waf.paranoia, waf.max_body_bytes, waf.timeout_ms, waf.on_overload
            ),
        ),
        None => stage("waf", false, "the app has no WAF".into()),
    }
    match &app.static_root {
        Some(root) if reads => stage(
            "static",
            true,
            format!("answered from {root}{path} if that file exists, else passed on"),
        ),
        Some(_) => stage(
            "static",
            false,
            format!("{method} is never served from files"),
        ),
        None => stage("static", false, "the app has no static root".into()),
    }
    match &app.cache {
        Some(_) if !reads => stage("cache", false, format!("{method} is not cached")),
        Some(cache) if !cache.paths.is_empty() && !cache.paths.iter().any(|p| p.matches(path)) => {
            stage(
                "cache",
                false,
                "the path is not among the cached paths".into(),
            )
        }
        Some(cache) => stage(
            "cache",
            true,
            format!(
                "{:?} cache: a fresh copy answers, a stale one is revalidated, else the answer \
                 is kept as its Cache-Control says{}",
                cache.store,
                cache
                    .default_ttl_s
                    .map_or(String::new(), |s| format!(" (at least {s} s fresh)"))
            ),
        ),
        None => stage("cache", false, "the app caches nothing".into()),
    }
    match &app.images {
        Some(images) if path.starts_with(images.prefix.as_str()) && reads => stage(
            "images",
            true,
            format!("resized on the worker pool ({}WxH/…)", images.prefix),
        ),
        Some(images) => stage(
            "images",
            false,
            format!("only {} GET/HEAD requests are resized", images.prefix),
        ),
        None => stage("images", false, "the app resizes no images".into()),
    }
    match &app.mirror {
        Some(mirror) if mirror.applies_to(method, path) => stage(
            "mirror",
            true,
            format!(
                "{}% of such requests (chosen by {:?}) copied to {:?}, never waited for",
                mirror.percent.percent(),
                mirror.key,
                mirror.backends
            ),
        ),
        Some(_) => stage(
            "mirror",
            false,
            "the method or path is outside the mirrored ones".into(),
        ),
        None => stage("mirror", false, "the app mirrors nothing".into()),
    }
    stages
}

/// The backend the next request would take, why, and the state of every backend.
fn next_backend(upstream: &Upstream, app: &App) -> NextBackend {
    let backends: Vec<BackendView> = upstream.backends().iter().map(|b| describe(b)).collect();
    let (next, why) = match upstream.peek() {
        None if backends.is_empty() => (None, "the app has no backends: 503".to_string()),
        None => (
            None,
            "no backend is usable (down, failing checks or retired): 502".to_string(),
        ),
        Some((backend, passive_marks_ignored)) => {
            let how = match app.balancer {
                Balancer::RoundRobin => "next in the weighted round-robin cycle",
                Balancer::LeastLoaded => {
                    "least loaded now (the next request compares two drawn at random)"
                }
            };
            let caveat = if passive_marks_ignored {
                "; every usable backend is passively marked down, so they are tried anyway"
            } else {
                ""
            };
            (Some(backend.address.to_string()), format!("{how}{caveat}"))
        }
    };
    NextBackend {
        next,
        why,
        balancer: app.balancer,
        backends,
    }
}

fn describe(backend: &BackendState) -> BackendView {
    BackendView {
        address: backend.address.to_string(),
        weight: backend.weight(),
        in_flight: backend.in_flight(),
        healthy: backend.is_usable(),
        failing_checks: !backend.passes_active_checks(),
        passively_down: backend.is_passively_down(),
        retired: backend.is_retired(),
    }
}
