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
use crate::routing::filter_modules::AppFilters;
use crate::routing::route_cache::{wildcard_parents, DomainMatch, RouteCache};
use crate::stage::cache;
use crate::stage::list::{Stage, LIST};

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
        stages: stages(
            &route.app,
            route.filters.as_deref(),
            &normalized,
            method,
            path,
        ),
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

/// Each stage of the list, in the order requests run them, and whether it acts on this
/// request: each says it in its own function, called in the list's order.
fn stages(
    app: &App,
    filters: Option<&AppFilters>,
    host: &str,
    method: &str,
    path: &str,
) -> Vec<StageVerdict> {
    let (path_only, query) = path
        .split_once('?')
        .map_or((path, None), |(p, q)| (p, Some(q)));
    let asked = Asked {
        app,
        filters,
        host,
        method,
        path,
        path_only,
        query,
        reads: method == "GET" || method == "HEAD",
    };
    let mut out = Verdicts::default();
    for row in &LIST {
        let explain: fn(&Asked<'_>, &mut Verdicts) = match row.stage {
            Stage::Redirects => redirects,
            Stage::AppPages => app_pages,
            Stage::Limits => limits,
            Stage::BasicAuth => basic_auth,
            Stage::HeaderRules => header_rules,
            Stage::Affinity => affinity,
            Stage::Compress => compress,
            Stage::Forwarding => forwarding,
            Stage::Https => https,
            Stage::Upstream => response_buffering,
            Stage::Waf => waf,
            Stage::Filters => app_filters,
            Stage::StaticFiles => static_files,
            Stage::Cache => cache,
            Stage::Images => images,
            Stage::Mirror => mirror,
            _ => continue,
        };
        explain(&asked, &mut out);
    }
    out.0
}

/// The request `explain` is asked about.
#[derive(Clone, Copy)]
struct Asked<'a> {
    app: &'a App,
    /// The app's filters as its route runs them, with their last errors.
    filters: Option<&'a AppFilters>,
    host: &'a str,
    method: &'a str,
    path: &'a str,
    path_only: &'a str,
    query: Option<&'a str>,
    reads: bool,
}

/// What the stages say, in order.
#[derive(Default)]
struct Verdicts(Vec<StageVerdict>);

impl Verdicts {
    fn say(&mut self, stage: &'static str, applies: bool, why: String) {
        self.0.push(StageVerdict {
            stage,
            applies,
            why,
        });
    }
}

fn redirects(asked: &Asked<'_>, out: &mut Verdicts) {
    let Asked {
        app,
        host,
        path_only,
        query,
        ..
    } = *asked;
    let moved = app
        .redirects
        .iter()
        .find_map(|r| Some((r.status, r.location(host, path_only, query)?)));
    match (app.redirects.len(), moved) {
        (0, _) => out.say("redirects", false, "the app lists no redirects".into()),
        (_, Some((status, location))) => out.say(
            "redirects",
            true,
            format!("answered {status} to {location}"),
        ),
        (n, None) => out.say(
            "redirects",
            false,
            format!("none of the app's {n} redirects takes this host and path"),
        ),
    }
}

fn app_pages(asked: &Asked<'_>, out: &mut Verdicts) {
    let Asked { app, .. } = *asked;
    match app.maintenance.as_deref() {
        Some(m) if m.enabled => out.say(
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
        _ => out.say("maintenance", false, "the app is not in maintenance".into()),
    }
    match app.error_pages.as_deref() {
        Some(pages) if !pages.0.is_empty() => out.say(
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
        _ => out.say("error_pages", false, "the router's own pages".into()),
    }
}

fn limits(asked: &Asked<'_>, out: &mut Verdicts) {
    let Asked { app, .. } = *asked;
    match &app.limits {
        Some(limits) => out.say(
            "limits",
            true,
            format!(
                "guardrails apply: {}",
                serde_json::to_string(limits).unwrap_or_default()
            ),
        ),
        None => out.say("limits", false, "the app sets no limits".into()),
    }
}

fn basic_auth(asked: &Asked<'_>, out: &mut Verdicts) {
    let Asked { app, path_only, .. } = *asked;
    match app.basic_auth.as_deref() {
        Some(auth) if auth.is_open(path_only) => out.say(
            "basic_auth",
            false,
            "the path is open: no password asked".into(),
        ),
        Some(auth) => out.say(
            "basic_auth",
            true,
            format!(
                "a user name and password are asked (realm \"{}\", {} users): 401 without",
                auth.realm,
                auth.users.len()
            ),
        ),
        None => out.say("basic_auth", false, "the app asks no password".into()),
    }
}

fn header_rules(asked: &Asked<'_>, out: &mut Verdicts) {
    let Asked { app, .. } = *asked;
    match app.headers.as_deref() {
        Some(rules) => out.say(
            "header_rules",
            true,
            format!(
                "request: {}; response: {}",
                serde_json::to_string(&rules.request).unwrap_or_default(),
                serde_json::to_string(&rules.response).unwrap_or_default()
            ),
        ),
        None => out.say("header_rules", false, "the app edits no fields".into()),
    }
}

fn affinity(asked: &Asked<'_>, out: &mut Verdicts) {
    let Asked { app, .. } = *asked;
    match &app.affinity {
        Some(affinity) => out.say(
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
        None => out.say("affinity", false, "requests are balanced one by one".into()),
    }
}

fn app_filters(asked: &Asked<'_>, out: &mut Verdicts) {
    let Asked { app, filters, .. } = *asked;
    if app.filters.is_empty() {
        out.say("filters", false, "the app runs no filter".into());
        return;
    }
    let mut said = Vec::with_capacity(app.filters.len());
    for used in &app.filters {
        let plugin = filters.and_then(|f| f.plugins.iter().find(|p| p.name() == used.name));
        let state = match (plugin, filters.and_then(|f| f.missing.as_ref())) {
            (Some(plugin), _) => {
                let stats = &plugin.stats;
                let failures = stats.failures.load(std::sync::atomic::Ordering::Relaxed);
                let last = stats.last_error.lock().clone();
                format!(
                    "module {}, {} instance(s), {failures} failure(s){}",
                    &plugin.sha256()[..12],
                    stats.instances.load(std::sync::atomic::Ordering::Relaxed),
                    last.map(|e| format!(", last: {e}")).unwrap_or_default()
                )
            }
            (None, Some((name, why))) if *name == used.name => format!("cannot run: {why}"),
            (None, _) => "not loaded: skipped (fail_open)".to_string(),
        };
        let failing = if used.fail_open {
            "fails open"
        } else {
            "fails closed (500)"
        };
        said.push(format!("{} ({failing}; {state})", used.name));
    }
    out.say("filters", true, format!("in order: {}", said.join("; ")));
}

fn compress(asked: &Asked<'_>, out: &mut Verdicts) {
    let Asked { app, .. } = *asked;
    match &app.compress {
        Some(compress) => out.say(
            "compress",
            true,
            format!(
                "answers of {} from {} bytes compressed (zstd, br or gzip, as the client \
                 prefers), streamed; one cached copy per coding",
                compress.types.join(", "),
                compress.min_bytes
            ),
        ),
        None => out.say("compress", false, "answers go as the app sends them".into()),
    }
}

fn forwarding(asked: &Asked<'_>, out: &mut Verdicts) {
    let Asked { app, .. } = *asked;
    out.say(
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
}

fn https(asked: &Asked<'_>, out: &mut Verdicts) {
    let Asked { app, .. } = *asked;
    out.say(
        "https_redirect",
        app.https_redirect,
        if app.https_redirect {
            "plain-HTTP requests get 308 to HTTPS; HTTPS ones go on".into()
        } else {
            "off: plain HTTP is served".into()
        },
    );
    match crate::stage::https::advertised_http3() {
        Some(alt_svc) if app.advertise_http3 => out.say(
            "http3",
            true,
            format!("HTTPS answers carry Alt-Svc: {alt_svc}; browsers move to HTTP/3"),
        ),
        Some(_) => out.say(
            "http3",
            false,
            "advertise_http3 is false: no Alt-Svc, clients stay on TCP".into(),
        ),
        None => out.say(
            "http3",
            false,
            "the router serves no HTTP/3 (--http3)".into(),
        ),
    }
}

fn response_buffering(asked: &Asked<'_>, out: &mut Verdicts) {
    let Asked { app, .. } = *asked;
    out.say(
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
}

fn waf(asked: &Asked<'_>, out: &mut Verdicts) {
    let Asked { app, .. } = *asked;
    match &app.waf {
        Some(waf) => out.say(
            "waf",
            true,
            format!(
                "inspected on the worker pool ({:?} mode, paranoia {}, bodies up to {} bytes, {} ms, on overload {:?})",
                waf.mode, waf.paranoia, waf.max_body_bytes, waf.timeout_ms, waf.on_overload
            ),
        ),
        None => out.say("waf", false, "the app has no WAF".into()),
    }
}

fn static_files(asked: &Asked<'_>, out: &mut Verdicts) {
    let Asked {
        app,
        method,
        path,
        reads,
        ..
    } = *asked;
    match &app.static_root {
        Some(root) if reads => out.say(
            "static",
            true,
            format!("answered from {root}{path} if that file exists, else passed on"),
        ),
        Some(_) => out.say(
            "static",
            false,
            format!("{method} is never served from files"),
        ),
        None => out.say("static", false, "the app has no static root".into()),
    }
}

fn cache(asked: &Asked<'_>, out: &mut Verdicts) {
    let Asked {
        app,
        method,
        path,
        reads,
        ..
    } = *asked;
    match &app.cache {
        Some(_) if !reads => out.say("cache", false, format!("{method} is not cached")),
        Some(cache) if !cache.paths.is_empty() && !cache.paths.iter().any(|p| p.matches(path)) => {
            out.say(
                "cache",
                false,
                "the path is not among the cached paths".into(),
            )
        }
        Some(cache) => out.say(
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
        None => out.say("cache", false, "the app caches nothing".into()),
    }
}

fn images(asked: &Asked<'_>, out: &mut Verdicts) {
    let Asked {
        app, path, reads, ..
    } = *asked;
    match &app.images {
        Some(images) if path.starts_with(images.prefix.as_str()) && reads => out.say(
            "images",
            true,
            format!("resized on the worker pool ({}WxH/…)", images.prefix),
        ),
        Some(images) => out.say(
            "images",
            false,
            format!("only {} GET/HEAD requests are resized", images.prefix),
        ),
        None => out.say("images", false, "the app resizes no images".into()),
    }
}

fn mirror(asked: &Asked<'_>, out: &mut Verdicts) {
    let Asked {
        app, method, path, ..
    } = *asked;
    match &app.mirror {
        Some(mirror) if mirror.applies_to(method, path) => out.say(
            "mirror",
            true,
            format!(
                "{}% of such requests (chosen by {:?}) copied to {:?}, never waited for",
                mirror.percent.percent(),
                mirror.key,
                mirror.backends
            ),
        ),
        Some(_) => out.say(
            "mirror",
            false,
            "the method or path is outside the mirrored ones".into(),
        ),
        None => out.say("mirror", false, "the app mirrors nothing".into()),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_model::parse_app_spec;

    /// `explain` says what the list declares, stage by stage in the list's order.
    #[test]
    fn the_verdicts_follow_the_stage_list() {
        let app = parse_app_spec(
            "a",
            &serde_json::json!({"domains": ["a.test"], "backends": ["127.0.0.1:9"]}),
        )
        .expect("a valid spec");
        let said: Vec<&str> = stages(&app, None, "a.test", "GET", "/")
            .iter()
            .map(|verdict| verdict.stage)
            .collect();
        let declared: Vec<&str> = LIST
            .iter()
            .flat_map(|row| row.explained_as.iter().copied())
            .collect();
        assert_eq!(said, declared);
    }
}
