//! The dashboard in a real browser: Debian's headless Chromium loads `/ui/` from the real
//! router (1,000 apps imported, real backends), runs its JavaScript against the admin API
//! and hands back the rendered DOM. With SWITCHYARD_SCREENSHOTS=DIR it also saves the
//! screenshots docs/dashboard.md shows.

use switchyard_test_support as support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use support::pki::Ca;
use support::{Backend, RouterProcess};

const CHROMIUM: &str = "/usr/bin/chromium";

/// Chromium with the flags a closed, root-run test machine needs.
fn chromium(profile: &Path, extra: &[String], url: &str) -> String {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: scripts/test installs Debian's chromium"
    );
    let output = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1280,900",
            // Virtual time runs the page's timers (two refreshes) without real waiting.
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .output()
        .expect("start chromium");
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

struct Browser {
    profile: tempfile::TempDir,
    base: String,
    screenshots: Option<PathBuf>,
}

impl Browser {
    fn new(router: &RouterProcess) -> Self {
        Self {
            profile: tempfile::tempdir().expect("profile dir"),
            base: format!("http://{}/ui/", router.admin),
            screenshots: std::env::var_os("SWITCHYARD_SCREENSHOTS").map(PathBuf::from),
        }
    }

    /// The DOM of `/ui/#{hash}` once its script has run.
    fn dom(&self, hash: &str) -> String {
        chromium(
            self.profile.path(),
            &["--dump-dom".into()],
            &format!("{}#{hash}", self.base),
        )
    }

    fn screenshot(&self, hash: &str, name: &str) {
        let Some(dir) = &self.screenshots else {
            return;
        };
        std::fs::create_dir_all(dir).expect("screenshot dir");
        let path = dir.join(name);
        chromium(
            self.profile.path(),
            &[format!("--screenshot={}", path.display())],
            &format!("{}#{hash}", self.base),
        );
        assert!(path.exists(), "no screenshot at {}", path.display());
    }
}

/// The text of the element with `id` in `dom` (no markup inside it).
fn text_of<'a>(dom: &'a str, id: &str) -> Option<&'a str> {
    let start = dom.find(&format!("id=\"{id}\""))?;
    let open = start + dom[start..].find('>')? + 1;
    let close = open + dom[open..].find('<')?;
    Some(dom[open..close].trim())
}

#[test]
fn the_dashboard_shows_live_figures_finds_apps_follows_health_and_explains_hosts() {
    let router = RouterProcess::start();
    let steady = Backend::start("steady");
    let doomed = Backend::start("doomed");
    seed_tenants_shop_and_wild(&router, &steady, &doomed);
    let browser = Browser::new(&router);
    the_overview_shows_live_figures(&router, &browser);
    search_finds_apps_by_domain_and_name(&browser);
    the_app_page_follows_health(&router, &browser, doomed);
    explain_shows_the_rule_that_routes_a_host(&browser);
    explain_shows_a_stored_copy(&router, &browser);
    the_app_page_shows_its_switches_but_no_password_hash(&browser);
    certificates_are_listed_soonest_first(&router, &browser);
    stored_filters_are_listed(&router, &browser);
    the_apps_page_charts_the_costliest_apps(&router, &browser);
}

fn the_apps_page_charts_the_costliest_apps(router: &RouterProcess, browser: &Browser) {
    // The chart draws whole 10 s samples: shop's requests are in one by now, or soon.
    support::eventually(Duration::from_secs(15), "a sample with shop's CPU", || {
        router.admin_call("GET", "/v1/stats/apps?sort=cpu", None).1["apps"][0]["cpu_ms"]
            .as_array()
            .is_some_and(|samples| samples.iter().any(|ms| ms.as_u64() > Some(0)))
    });
    let by_cpu = browser.dom("/apps?sort=cpu");
    browser.screenshot("/apps?sort=cpu", "dashboard-apps-by-cpu.png");
    assert!(by_cpu.contains("CPU ms/s"), "{by_cpu}");
    assert!(
        by_cpu.contains("aria-label=\"CPU per app, stacked\"") && by_cpu.contains("<rect"),
        "the stacked chart of the costliest apps: {by_cpu}"
    );
    assert!(by_cpu.contains("href=\"#/app/shop\""), "{by_cpu}");
}

fn stored_filters_are_listed(router: &RouterProcess, browser: &Browser) {
    let module = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/filters/target/wasm32-unknown-unknown/release/header_policy.wasm");
    let stored = std::process::Command::new(RouterProcess::binary())
        .args(["filters", "put", "tenant-policy"])
        .arg(&module)
        .args(["--admin", &router.admin.to_string()])
        .output()
        .expect("switchyard filters put");
    assert!(
        stored.status.success(),
        "{}",
        String::from_utf8_lossy(&stored.stderr)
    );
    let listed = browser.dom("/filters");
    assert!(
        listed.contains("tenant-policy") && listed.contains("KiB"),
        "{listed}"
    );
}

/// 1,000 apps through the bulk import, then the ones the views are checked on (shop, with
/// traffic in the history; wild, written last), and shop asked for 40 times.
fn seed_tenants_shop_and_wild(router: &RouterProcess, steady: &Backend, doomed: &Backend) {
    let lines: Vec<String> = (0..1000)
        .map(|i| {
            json!({"name": format!("tenant-{i:04}"), "domains": [format!("tenant-{i:04}.ui.test")],
                   "backends": [steady.addr.to_string()]})
            .to_string()
        })
        .collect();
    let (status, answer) = router.admin_call("POST", "/v1/import/apps", Some(&lines.join("\n")));
    assert_eq!(
        (status, answer["applied"].clone()),
        (200, json!(1000)),
        "{answer}"
    );
    router.put_app(
        "shop",
        json!({
            "domains": ["shop.ui.test", "www.shop.ui.test"],
            "backends": [steady.addr.to_string(), doomed.addr.to_string()],
            "health_check": {"path": "/health", "interval_ms": 200, "timeout_ms": 150, "unhealthy_threshold": 1},
            "cache": {"paths": ["/assets/*"]},
        }),
    );
    router.put_app(
        "review",
        json!({
            "domains": ["review.ui.test", "www.review.ui.test"],
            "backends": [steady.addr.to_string()],
            "redirects": [{"host": "www.review.ui.test", "to": "https://review.ui.test"}],
            "maintenance": {"enabled": true, "retry_after_s": 120, "page_html": "<h1>soon</h1>"},
            "basic_auth": {"realm": "Review", "users": {"alice": REVIEW_HASH}},
            "affinity": {"cookie": "route"}
        }),
    );
    router.put_app(
        "wild",
        json!({"domains": ["*.wild.ui.test"], "backends": [steady.addr.to_string()]}),
    );
    for _ in 0..40 {
        assert_eq!(router.get("shop.ui.test", "/").status, 200);
    }
    assert_eq!(router.get("tenant-0007.ui.test", "/").status, 200);
    // Listed at once: the history's sample in progress counts (not its next, 10 s away).
    let shop = router.admin_call("GET", "/v1/stats/apps?app=shop", None).1;
    assert!(
        shop["apps"].as_array().is_some_and(|apps| !apps.is_empty()),
        "shop is in the traffic history right after its requests: {shop}"
    );
}

fn the_overview_shows_live_figures(router: &RouterProcess, browser: &Browser) {
    // Traffic while the overview renders, so its figures move between two refreshes.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = {
        let (stop, port) = (stop.clone(), router.http);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = support::get(port, "shop.ui.test", "/");
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let overview = browser.dom("/");
    browser.screenshot("/", "dashboard-overview.png");
    stop.store(true, Ordering::Relaxed);
    let _ = traffic.join();
    let requests_per_s = text_of(&overview, "rps").expect("a requests/s card");
    assert!(
        requests_per_s.parse::<f64>().is_ok_and(|rate| rate > 0.0),
        "requests/s is a live number after two refreshes: {requests_per_s:?}"
    );
    assert_eq!(
        text_of(&overview, "store"),
        Some("embedded"),
        "the store card"
    );
    assert!(
        overview.contains("href=\"#/app/shop\""),
        "the busiest apps list shop"
    );
    // The last app written (wild) heads the recent changes, with its domain.
    let changes = &overview[overview.find("id=\"changes\"").expect("recent changes")..];
    let newest = changes
        .find("href=\"#/app/wild\"")
        .expect("wild's change listed");
    assert!(
        changes[newest..].find("*.wild.ui.test").is_some(),
        "{changes}"
    );
}

fn search_finds_apps_by_domain_and_name(browser: &Browser) {
    let by_domain = browser.dom("/apps?q=www.shop.ui.test");
    assert!(
        by_domain.contains("href=\"#/app/shop\"") && by_domain.contains("exact"),
        "{by_domain}"
    );
    let by_prefix = browser.dom("/apps?q=tenant-099");
    assert!(by_prefix.contains("tenant-0990") && by_prefix.contains("tenant-0999"));
    assert!(
        !by_prefix.contains("tenant-0989"),
        "only names with the prefix"
    );
}

/// The app page: both backends healthy, then one killed and shown down.
fn the_app_page_follows_health(router: &RouterProcess, browser: &Browser, doomed: Backend) {
    let healthy = browser.dom("/app/shop");
    assert_eq!(healthy.matches(">healthy<").count(), 2, "{healthy}");
    let classes = text_of(&healthy, "app-classes").unwrap_or_default();
    let answered = router.metric("switchyard_requests_total{app=\"shop\",class=\"2xx\"}");
    assert!(
        answered >= 40.0 && classes.contains(&format!("2xx {answered} ")),
        "the app's own counters: {classes} (the router counts {answered})"
    );
    assert!(
        !healthy.contains("tenant-0007"),
        "only the app's series are read"
    );
    let p99 = text_of(&healthy, "app-p99").unwrap_or_default();
    assert!(
        p99.starts_with("≤ ") && p99.ends_with(" ms"),
        "a p99 bound: {p99:?}"
    );
    doomed.stop();
    support::eventually(
        Duration::from_secs(10),
        "the health check marks it down",
        || {
            router
                .admin_call("GET", "/v1/explain?host=shop.ui.test", None)
                .1["backend"]["backends"]
                .as_array()
                .is_some_and(|b| b.iter().any(|b| b["failing_checks"] == true))
        },
    );
    let degraded = browser.dom("/app/shop");
    assert!(
        degraded.contains("down (failing health checks)"),
        "{degraded}"
    );
    assert!(degraded.contains(&doomed.addr.to_string()));
    browser.screenshot("/app/shop", "dashboard-app.png");
}

/// A bcrypt hash in htpasswd's format; its password is never asked here.
const REVIEW_HASH: &str = "$2y$05$abcdefghijklmnopqrstuu5Fq0CPVNy2eUQx3oVbD3hrvP5lOa1Xq";

/// The app page lists the app's switches, the users of its password without their hashes;
/// explain says the maintenance answers before the password is asked.
fn the_app_page_shows_its_switches_but_no_password_hash(browser: &Browser) {
    let page = browser.dom("/app/review");
    let switches = page
        .find("id=\"switches\"")
        .and_then(|start| Some(&page[start..start + page[start..].find("</table>")?]))
        .unwrap_or_default();
    for shown in [
        "maintenance",
        "(503, Retry-After 120 s",
        "alice",
        "Review",
        "route",
        "https://review.ui.test",
    ] {
        assert!(switches.contains(shown), "{shown} in {switches}");
    }
    assert!(
        !page.contains("$2y$"),
        "a password hash on the page: {page}"
    );
    let explained = browser.dom("/explain?host=review.ui.test&path=/");
    for stage in ["maintenance", "basic_auth", "affinity", "redirects"] {
        assert!(
            explained.contains(&format!("<td>{stage}</td>")),
            "{stage}: {explained}"
        );
    }
}

/// Explain a host: the wildcard rule that routes it.
fn explain_shows_the_rule_that_routes_a_host(browser: &Browser) {
    let explained = browser.dom("/explain?host=eu.api.wild.ui.test&path=/x");
    let verdict = text_of(&explained, "verdict")
        .map(str::to_string)
        .unwrap_or_default();
    assert!(
        explained.contains("<strong>wildcard</strong>") && explained.contains("*.wild.ui.test"),
        "{verdict} / {explained}"
    );
    browser.screenshot(
        "/explain?host=eu.api.wild.ui.test&path=/x",
        "dashboard-explain.png",
    );
}

/// A cached path: the explain page lists the stored copy, its lifetime and what decided it.
fn explain_shows_a_stored_copy(router: &RouterProcess, browser: &Browser) {
    let path = "/assets/app.js?cc=max-age=600";
    assert_eq!(router.get("shop.ui.test", path).status, 200);
    let explained =
        browser.dom("/explain?host=shop.ui.test&path=%2Fassets%2Fapp.js%3Fcc%3Dmax-age%3D600");
    let table = explained
        .find("id=\"stored\"")
        .map(|start| &explained[start..]);
    let copies = table
        .and_then(|t| t.find("</table>").map(|end| &t[..end]))
        .unwrap_or_default();
    assert!(
        copies.contains("http://shop.ui.test/assets/app.js?cc=max-age=600")
            && copies.contains("600 s")
            && copies.contains("max-age")
            && copies.contains("fresh"),
        "{copies} / {explained}"
    );
}

/// Certificates: the store's expiry index, soonest first.
fn certificates_are_listed_soonest_first(router: &RouterProcess, browser: &Browser) {
    let ca = Ca::root("Dashboard Root");
    for (domain, days) in [
        ("later.ui.test", 80),
        ("soonest.ui.test", 6),
        ("middle.ui.test", 40),
    ] {
        router.store_cert(domain, &ca.issue(&[domain], -1, days));
    }
    let listed = browser.dom("/certs");
    let at = |domain: &str| {
        listed
            .find(domain)
            .unwrap_or_else(|| panic!("{domain} listed: {listed}"))
    };
    assert!(
        at("soonest.ui.test") < at("middle.ui.test") && at("middle.ui.test") < at("later.ui.test"),
        "expiring soonest first"
    );
    assert!(listed.contains("no later ones"), "one page holds them all");
    browser.screenshot("/certs", "dashboard-certs.png");
}

/// One headless Chromium page driven over the DevTools protocol: the views that write need
/// clicks and typing, which a `--dump-dom` run cannot do.
struct DevToolsPage {
    _chromium: KilledOnDrop,
    socket: tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>>,
    next_id: u64,
    _profile: tempfile::TempDir,
}

impl DevToolsPage {
    fn open() -> Self {
        let profile = tempfile::tempdir().expect("profile dir");
        let port = support::free_port();
        let chromium = Command::new(CHROMIUM)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--window-size=1280,900",
            ])
            .arg(format!("--remote-debugging-port={port}"))
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromium");
        // Owned from here: a failure below still stops this browser.
        let chromium = KilledOnDrop(chromium);
        let list = format!("http://127.0.0.1:{port}/json/list");
        let mut page_url = None;
        support::eventually(
            Duration::from_secs(20),
            "Chromium's DevTools endpoint",
            || {
                // Chromium keeps this connection open after its answer: ureq reads by length.
                let Ok(targets) = ureq::get(&list).timeout(Duration::from_secs(2)).call() else {
                    return false;
                };
                let Ok(targets) = targets.into_json::<Value>() else {
                    return false;
                };
                page_url = targets.as_array().and_then(|targets| {
                    targets
                        .iter()
                        .find(|t| t["type"] == "page")
                        .and_then(|t| t["webSocketDebuggerUrl"].as_str().map(str::to_string))
                });
                page_url.is_some()
            },
        );
        let (socket, _) =
            tungstenite::connect(page_url.expect("a page target")).expect("DevTools WebSocket");
        Self {
            _chromium: chromium,
            socket,
            next_id: 0,
            _profile: profile,
        }
    }

    /// Sends one command and returns its result, skipping the events in between.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let command = json!({"id": id, "method": method, "params": params}).to_string();
        self.socket
            .send(tungstenite::Message::text(command))
            .expect("send to DevTools");
        loop {
            let message = self.socket.read().expect("DevTools answers");
            let Ok(text) = message.to_text() else {
                continue;
            };
            let answer: Value = serde_json::from_str(text).expect("DevTools sends JSON");
            if answer["id"] == id {
                assert!(answer.get("error").is_none(), "{method}: {answer}");
                return answer["result"].clone();
            }
        }
    }

    fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url}));
    }

    /// The value of `expression` (awaited if it is a promise); fails on a thrown error.
    fn eval(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "awaitPromise": true, "returnByValue": true}),
        );
        assert!(
            result.get("exceptionDetails").is_none(),
            "{expression}: {result}"
        );
        result["result"]["value"].clone()
    }

    /// Waits (10 s at most, in the page) until `condition` is truthy; returns its value.
    fn wait_for(&mut self, condition: &str, what: &str) -> Value {
        self.eval(&format!(
            "new Promise((done, fail) => {{ const started = Date.now(); const check = () => {{ \
               let value = null; try {{ value = ({condition}); }} catch (e) {{}} \
               if (value) done(value); \
               else if (Date.now() - started > 10000) fail(new Error({what:?} + ': not within 10 s')); \
               else setTimeout(check, 50); }}; check(); }})"
        ))
    }
}

/// A browser process stopped when its owner goes, panicking tests included (Debian's
/// launcher execs Chromium, so this is the browser's own PID).
struct KilledOnDrop(Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_dashboard_edits_apps_and_purges_caches_only_when_the_router_allows_it() {
    let backend = Backend::start("shop");
    let router = RouterProcess::start_with(&["--admin-ui-writes", "on"]);
    router.put_app(
        "shop",
        json!({"domains": ["shop.ui.test"], "backends": [backend.addr.to_string()],
               "cache": {"paths": ["/assets/*"]}}),
    );
    let mut page = DevToolsPage::open();
    page.navigate(&format!("http://{}/ui/#/app/shop", router.admin));
    let port = router.admin.port();
    page.wait_for(
        &format!("location.port === '{port}' && document.getElementById('edit-app')"),
        "the edit button",
    );
    page.eval("document.getElementById('edit-app').click()");
    page.wait_for(
        "document.getElementById('app-json').value.includes('shop.ui.test')",
        "the app's JSON in the editor",
    );

    // An operator adds a domain in the editor and saves.
    page.eval(
        "(() => { const editor = document.getElementById('app-json'); \
           const app = JSON.parse(editor.value); app.domains.push('new.shop.ui.test'); \
           editor.value = JSON.stringify(app, null, 2); \
           document.getElementById('save-app').click(); })()",
    );
    let result = page.wait_for(
        "document.getElementById('write-result').textContent",
        "the save's answer",
    );
    assert_eq!(result, "saved: routing follows now");
    assert_eq!(router.get("new.shop.ui.test", "/").status, 200);
    // The page's recent changes name the save, its author and the field it changed.
    let recorded = page.wait_for(
        "(() => { const t = document.getElementById('app-audit'); \
           return t && t.textContent.includes('PUT /v1/apps/shop') && t.textContent; })()",
        "the save in the app's recent changes",
    );
    let recorded = recorded.as_str().unwrap_or_default();
    assert!(
        recorded.contains("anonymous") && recorded.contains("domains"),
        "{recorded}"
    );

    // A refused edit shows the API's reason with the field, and changes nothing.
    page.eval(
        "(() => { document.getElementById('write-result').textContent = ''; \
           document.getElementById('edit-app').click(); })()",
    );
    page.wait_for(
        "document.getElementById('app-json').value.includes('new.shop.ui.test')",
        "the saved app in the editor",
    );
    page.eval(
        "(() => { const editor = document.getElementById('app-json'); \
           const app = JSON.parse(editor.value); app.domains = ['not a domain']; \
           editor.value = JSON.stringify(app); document.getElementById('save-app').click(); })()",
    );
    let refused = page.wait_for(
        "document.getElementById('write-result').textContent",
        "the refusal",
    );
    assert!(
        refused
            .as_str()
            .is_some_and(|r| r.starts_with("refused: domains")),
        "{refused}"
    );
    assert_eq!(router.get("new.shop.ui.test", "/").status, 200, "unchanged");

    page.eval(
        "(() => { document.getElementById('write-result').textContent = ''; \
           document.getElementById('purge-cache').click(); })()",
    );
    let purged = page.wait_for(
        "document.getElementById('write-result').textContent",
        "the purge's answer",
    );
    assert_eq!(purged, "purged");
    let (_, log) = router.admin_call("GET", "/v1/changes?limit=1", None);
    assert_eq!(log["changes"][0]["kind"], "cache_purge", "{log}");

    // The overview lists both changes.
    page.navigate(&format!("http://{}/ui/#/", router.admin));
    let changes = page.wait_for(
        "(text => text.includes('cache purge') ? text : null)\
         ((document.getElementById('changes') || {}).textContent || '')",
        "the recent changes",
    );
    assert!(
        changes
            .as_str()
            .is_some_and(|t| t.contains("new.shop.ui.test")),
        "{changes}"
    );

    // A router left read-only: no write controls, and the page's own writes are refused.
    let read_only = RouterProcess::start();
    read_only.put_app(
        "shop",
        json!({"domains": ["shop.ui.test"], "backends": [backend.addr.to_string()]}),
    );
    page.navigate(&format!("http://{}/ui/#/app/shop", read_only.admin));
    let port = read_only.admin.port();
    page.wait_for(
        &format!("location.port === '{port}' && document.getElementById('backends')"),
        "the read-only app page",
    );
    assert_eq!(
        page.eval("document.getElementById('edit-app') === null"),
        json!(true)
    );
    assert_eq!(
        page.eval("fetch('/v1/apps/shop', {method: 'DELETE'}).then(r => r.status)"),
        json!(403)
    );
    assert_eq!(read_only.admin_call("GET", "/v1/apps/shop", None).0, 200);
}
