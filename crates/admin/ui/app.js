// Switchyard's dashboard: plain JavaScript over the admin API, no build step. Every view
// is a function of the URL's hash (#/apps?q=…), so a view can be bookmarked and shared,
// and the router's data stays behind the API's token.
"use strict";

const view = document.getElementById("view");
const statusLine = document.getElementById("status");
let token = sessionStorage.getItem("switchyard-token") || "";
let refresh = null;
// What the router lets the dashboard do (GET /v1/ui/settings): write controls are shown
// only when the API would accept them.
let settings = null;

// `init` carries a write's method and body; the browser adds `Origin` to it, by which the
// API tells the dashboard's writes from the CLI's.
async function api(path, text, init = {}) {
  const headers = token ? { Authorization: "Bearer " + token } : {};
  if (init.body) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { ...init, headers });
  if (response.status === 401) {
    token = prompt("Admin token") || "";
    sessionStorage.setItem("switchyard-token", token);
    return api(path, text, init);
  }
  if (text) return response.text();
  const body = response.status === 204 ? {} : await response.json();
  if (!response.ok) throw new Error((body.field ? body.field + ": " : "") + (body.error || response.status));
  return body;
}

function escape(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

// A bar per 10 s sample, scaled to the series' own maximum: readable with one sample or 90.
function sparkline(series, width = 180, height = 28) {
  if (!series || series.length === 0) return "";
  const max = Math.max(1, ...series);
  const slot = width / 90;
  const bars = series.map((v, i) => {
    const h = Math.max(1, (v / max) * (height - 2));
    const x = width - (series.length - i) * slot;
    return `<rect x="${x.toFixed(1)}" y="${(height - h).toFixed(1)}" width="${Math.max(1, slot - 0.5).toFixed(1)}" height="${h.toFixed(1)}" fill="#2f5fd0"/>`;
  });
  return `<svg class="spark" width="${width}" height="${height}"><rect width="${width}" height="${height}" fill="#eef1f5"/>${bars.join("")}</svg>`;
}

// Prometheus text → { "name{labels}": value }.
function parseMetrics(text) {
  const values = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const at = line.lastIndexOf(" ");
    values[line.slice(0, at)] = Number(line.slice(at + 1));
  }
  return values;
}

function sum(metrics, prefix, filter = () => true) {
  let total = 0;
  for (const [key, value] of Object.entries(metrics)) {
    if ((key === prefix || key.startsWith(prefix + "{")) && filter(key)) total += value;
  }
  return total;
}

// The le="…" quantile of a histogram's increase between two scrapes, in ms.
function quantile(before, after, name, q) {
  const buckets = [];
  for (const [key, value] of Object.entries(after)) {
    const match = key.match(new RegExp(`^${name}_bucket\\{.*le="([^"]+)"`));
    if (!match) continue;
    const le = match[1] === "+Inf" ? Infinity : Number(match[1]);
    const delta = value - (before[key] || 0);
    const at = buckets.findIndex((b) => b.le === le);
    if (at >= 0) buckets[at].count += delta; else buckets.push({ le, count: delta });
  }
  buckets.sort((a, b) => a.le - b.le);
  const total = buckets.length ? buckets[buckets.length - 1].count : 0;
  if (total <= 0) return null;
  const wanted = total * q;
  const found = buckets.find((b) => b.count >= wanted);
  return found && Number.isFinite(found.le) ? found.le * 1000 : null;
}

function card(label, value, id) {
  return `<div class="card"><div class="label">${escape(label)}</div><div class="value" id="${id}">${escape(value)}</div></div>`;
}

let previous = null;

async function overview() {
  view.innerHTML = `<h1>Overview</h1><div class="cards">
    ${card("requests/s", "…", "rps")}${card("5xx share", "…", "errors")}
    ${card("p50 ms", "…", "p50")}${card("p99 ms", "…", "p99")}
    ${card("requests in flight", "…", "active")}${card("open WebSockets", "…", "websockets")}
    ${card("route cache hits", "…", "routehits")}${card("certificate cache hits", "…", "certhits")}
    ${card("route changes", "…", "route-changes")}${card("store", "…", "store")}
    ${card("store sync", "…", "store-sync")}${card("ACME failing", "…", "acme-failing")}
  </div><h2>Busiest apps (last minute)</h2><div id="busiest"></div>
  <h2>Recent changes</h2><div id="changes"></div>`;
  const tick = async () => {
    const [text, store, busiest, changes] = await Promise.all([
      api("/metrics", true), api("/v1/store"), api("/v1/stats/apps?limit=10"), api("/v1/changes?limit=15"),
    ]);
    const now = { at: Date.now(), metrics: parseMetrics(text) };
    const m = now.metrics;
    const answered = sum(m, "switchyard_requests_total");
    if (previous) {
      const seconds = (now.at - previous.at) / 1000;
      const delta = answered - sum(previous.metrics, "switchyard_requests_total");
      const errors = sum(m, "switchyard_requests_total", (k) => k.includes('class="5xx"'))
        - sum(previous.metrics, "switchyard_requests_total", (k) => k.includes('class="5xx"'));
      set("rps", (delta / seconds).toFixed(1));
      set("errors", delta > 0 ? ((100 * errors) / delta).toFixed(2) + "%" : "–");
      const p50 = quantile(previous.metrics, m, "switchyard_request_duration_seconds", 0.5);
      const p99 = quantile(previous.metrics, m, "switchyard_request_duration_seconds", 0.99);
      set("p50", p50 === null ? "–" : "≤ " + p50);
      set("p99", p99 === null ? "–" : "≤ " + p99);
    }
    previous = now;
    set("active", sum(m, "switchyard_active_requests"));
    set("websockets", sum(m, "switchyard_open_websockets"));
    const ratio = (hits, misses) => {
      const h = sum(m, hits), total = h + sum(m, misses);
      return total ? ((100 * h) / total).toFixed(1) + "%" : "–";
    };
    set("routehits", ratio("switchyard_route_cache_hits_total", "switchyard_route_cache_misses_total"));
    set("certhits", ratio("switchyard_cert_cache_hits_total", "switchyard_cert_cache_misses_total"));
    set("route-changes", sum(m, "switchyard_route_changes_total"));
    // A shared store (Redis) tells whether its change subscription is up and since when
    // this router knows itself in step; the embedded file has nothing to follow.
    set("store-sync", store.subscribed === undefined ? "local file"
      : `${store.subscribed ? "subscribed" : "NOT subscribed"}` +
        (store.seconds_since_last_sync !== undefined ? ` · ${store.seconds_since_last_sync} s ago` : ""));
    // Only the router holding the ACME lease counts domains by state.
    set("acme-failing", "switchyard_acme_domains{state=\"failed\"}" in m ? m["switchyard_acme_domains{state=\"failed\"}"] : "–");
    set("store", `${store.kind}${store.available ? "" : " (unavailable)"}` +
      (store.last_revision !== undefined && store.last_revision !== null ? ` rev ${store.last_revision}` : ""));
    document.getElementById("busiest").innerHTML = busiestTable(busiest);
    document.getElementById("changes").innerHTML = changesTable(changes);
  };
  await tick();
  refresh = setInterval(() => tick().catch(showError), 2000);
}

function set(id, value) {
  const element = document.getElementById(id);
  if (element) element.textContent = value;
}

// The history keeps durations in buckets: a p99 reads "≤ bound".
function p99(ms) {
  if (ms === null || ms === undefined) return "–";
  return ms >= 10000 ? "≥ 10 s" : `≤ ${ms} ms`;
}

function busiestTable(stats) {
  if (!stats.apps.length) return `<p class="muted">No app answered a request in the last ${stats.window_s / 60} minutes.</p>`;
  const rows = stats.apps.map((a) => `<tr><td><a href="#/app/${encodeURIComponent(a.app)}">${escape(a.app)}</a></td>
    <td>${a.rps_10s.toFixed(1)}</td><td>${a.rps_1m.toFixed(1)}</td>
    <td>${(a.error_ratio_1m * 100).toFixed(1)}%</td><td>${(a.client_error_ratio_1m * 100).toFixed(1)}%</td>
    <td>${p99(a.p99_ms_1m)}</td><td>${a.cpu_ms_per_s_1m.toFixed(1)}</td><td>${sparkline(a.requests)}</td></tr>`).join("");
  return `<table><tr><th>app</th><th>req/s (10 s)</th><th>req/s (1 min)</th><th>5xx</th><th>4xx</th><th>p99 (1 min)</th><th title="the router's CPU spent for the app, ms a second (1000 = one core)">CPU ms/s</th><th>last 15 min</th></tr>${rows}</table>
    <p class="muted">History: ${stats.tracked_apps} apps with traffic kept (at most ${stats.max_apps}), ${(stats.memory_bytes / 1024).toFixed(0)} KiB.</p>`;
}

// Each top app's CPU over the history's samples, stacked (10 s a bar): the noisy
// neighbour is the band that fills the chart.
function cpuChart(stats) {
  const top = stats.apps.filter((a) => a.cpu_ms.some((v) => v > 0)).slice(0, 8);
  if (!top.length) return "";
  const samples = Math.max(...top.map((a) => a.cpu_ms.length));
  const at = (a, i) => a.cpu_ms[i - (samples - a.cpu_ms.length)] || 0;
  const totals = Array.from({ length: samples }, (_, i) => top.reduce((sum, a) => sum + at(a, i), 0));
  const most = Math.max(1, ...totals);
  const [w, h] = [Math.max(1, Math.floor(720 / samples)), 120];
  let bars = "";
  for (let i = 0; i < samples; i++) {
    let y = h;
    top.forEach((a, n) => {
      const height = (at(a, i) / most) * h;
      y -= height;
      if (height > 0) bars += `<rect x="${i * w}" y="${y.toFixed(1)}" width="${w}" height="${height.toFixed(1)}" fill="hsl(${(n * 47) % 360},60%,55%)"><title>${escape(a.app)}: ${at(a, i)} ms</title></rect>`;
    });
  }
  const legend = top.map((a, n) => `<span style="color:hsl(${(n * 47) % 360},60%,45%)">■</span> ${escape(a.app)}`).join(" &nbsp; ");
  return `<h2>CPU of the costliest apps, last ${stats.window_s / 60} minutes</h2>
    <svg width="${samples * w}" height="${h}" role="img" aria-label="CPU per app, stacked">${bars}</svg>
    <p class="muted">${legend} — the tallest bar: ${most} ms of CPU in 10 s.</p>`;
}

function changesTable(log) {
  if (!log.changes.length) return `<p class="muted">No change applied since this router started.</p>`;
  const subject = (c) => c.kind === "app" || c.kind === "cache_purge" || c.kind === "backend_addresses"
    ? `<a href="#/app/${encodeURIComponent(c.subject)}">${escape(c.subject)}</a>` : escape(c.subject);
  const rows = log.changes.map((c) => `<tr><td>${escape(new Date(c.at_unix_ms).toLocaleTimeString())}</td>
    <td>${escape(c.kind.replace("_", " "))}</td><td>${subject(c)}</td>
    <td>${(c.domains || []).map(escape).join(", ")}${c.domains_total > (c.domains || []).length ? ` and ${c.domains_total - c.domains.length} more` : ""}</td>
    <td>${escape(c.detail || "")}</td><td>${c.apply_us < 1000 ? c.apply_us + " µs" : (c.apply_us / 1000).toFixed(1) + " ms"}</td></tr>`).join("");
  return `<table><tr><th>applied</th><th>what</th><th>app / domain</th><th>domains</th><th></th><th>took</th></tr>${rows}</table>
    <p class="muted">The last ${log.changes.length} of at most ${log.kept_at_most} kept by this router.</p>`;
}

// Apps: a query is an app name (prefix, through the store's ordered listing) or a domain
// (through the router's own host matching, wildcards included).
async function apps(params) {
  const q = (params.get("q") || "").trim().toLowerCase();
  const sort = params.get("sort") || "name";
  view.innerHTML = `<h1>Apps</h1><form id="search"><input name="q" size="40" placeholder="app name or domain" value="${escape(q)}">
    <button>Search</button> <span class="muted">or the busiest: <a href="#/apps?sort=traffic">by traffic</a> · <a href="#/apps?sort=errors">by 5xx</a> · <a href="#/apps?sort=cpu">by CPU</a></span></form><div id="results"></div>`;
  document.getElementById("search").onsubmit = (e) => {
    e.preventDefault();
    location.hash = "#/apps?q=" + encodeURIComponent(new FormData(e.target).get("q"));
  };
  const results = document.getElementById("results");
  if (sort !== "name") {
    const by = ["errors", "cpu"].includes(sort) ? sort : "traffic";
    const stats = await api(`/v1/stats/apps?sort=${by}&limit=50`);
    results.innerHTML = (by === "cpu" ? cpuChart(stats) : "") + busiestTable(stats);
    return;
  }
  const found = new Map();
  if (q) {
    const host = await api("/v1/explain?host=" + encodeURIComponent(q));
    if (host.app) found.set(host.app, `serves ${escape(q)} (${host.rule} ${escape(host.domain)})`);
  }
  const page = await api("/v1/apps?limit=50" + (q ? "&after=" + encodeURIComponent(beforePrefix(q)) : ""));
  for (const app of page.apps) {
    if (q && !app.name.startsWith(q)) break;
    if (!found.has(app.name)) found.set(app.name, (app.domains || []).map(escape).join(", "));
  }
  if (!found.size) { results.innerHTML = `<p class="muted">No app is named ${escape(q)}… or serves it.</p>`; return; }
  results.innerHTML = `<table><tr><th>app</th><th>domains / match</th></tr>${[...found].map(([name, why]) =>
    `<tr><td><a href="#/app/${encodeURIComponent(name)}">${escape(name)}</a></td><td>${why}</td></tr>`).join("")}</table>`;
}

// The greatest name before every name starting with `prefix`: listing after it starts there.
function beforePrefix(prefix) {
  const last = prefix.charCodeAt(prefix.length - 1);
  return prefix.slice(0, -1) + String.fromCharCode(last - 1) + "\u{ffff}";
}

async function appPage(name) {
  view.innerHTML = `<div id="live"></div><div id="edit"></div>`;
  const live = document.getElementById("live");
  if (settings.writes) editPanel(name);
  const tick = async () => {
    const [app, stats, counters, audit] = await Promise.all([
      api("/v1/apps/" + encodeURIComponent(name)),
      api("/v1/stats/apps?app=" + encodeURIComponent(name)),
      api("/metrics?app=" + encodeURIComponent(name), true).then(parseMetrics),
      // A token whose scope does not reach the audit log still sees the rest of the page.
      api("/v1/audit?limit=10&app=" + encodeURIComponent(name)).catch(() => null),
    ]);
    const count = (metric, label) => sum(counters, metric, (k) => !label || k.includes(label));
    const lookups = count("switchyard_cache_requests_total");
    const classes = ["2xx", "3xx", "4xx", "5xx"].map((c) =>
      `${c} ${count("switchyard_requests_total", `class="${c}"`)}`).join(" · ");
    const domain = (app.domains || [])[0];
    const explained = domain ? await api("/v1/explain?host=" + encodeURIComponent(domain.replace("*.", "any."))) : null;
    const backends = explained && explained.backend ? explained.backend.backends : [];
    const traffic = stats.apps[0];
    const certs = await Promise.all((app.domains || []).map((d) =>
      api("/v1/certs/" + encodeURIComponent(d)).catch(() => null)));
    live.innerHTML = `<h1>${escape(name)}</h1>
      <div class="cards">${card("req/s (1 min)", traffic ? traffic.rps_1m.toFixed(1) : "0", "app-rps")}
      ${card("5xx (1 min)", traffic ? (traffic.error_ratio_1m * 100).toFixed(1) + "%" : "–", "app-errors")}
      ${card("4xx (1 min)", traffic ? (traffic.client_error_ratio_1m * 100).toFixed(1) + "%" : "–", "app-4xx")}
      ${card("p99 (1 min)", traffic ? p99(traffic.p99_ms_1m) : "–", "app-p99")}
      ${card("cache hits", lookups ? ((100 * count("switchyard_cache_requests_total", 'result="HIT"')) / lookups).toFixed(1) + "%" : "–", "app-cache")}
      ${card("WAF blocks", app.waf ? count("switchyard_waf_requests_total", 'result="blocked"') : "–", "app-waf")}
      ${card("mirror copies", app.mirror ? count("switchyard_mirror_sent_total") : "–", "app-mirror")}</div>
      <p class="muted" id="app-classes">answers since start: ${escape(classes)}</p>
      <p>${traffic ? sparkline(traffic.requests, 600, 60) : '<span class="muted">No traffic in the last 15 minutes.</span>'}</p>
      <h2>Domains</h2><p>${(app.domains || []).map((d) => `<code>${escape(d)}</code>`).join(" ") || "none"}</p>
      <h2>Backends (${escape(app.balancer)})</h2>
      <table id="backends"><tr><th>address</th><th>weight</th><th>in flight</th><th>health</th></tr>${backends.map((b) =>
        `<tr><td>${escape(b.address)}</td><td>${b.weight}</td><td>${b.in_flight}</td><td class="${b.healthy ? "ok" : "bad"}">${backendState(b)}</td></tr>`).join("")}</table>
      <h2>Features</h2><table>${["waf", "cache", "mirror", "images", "limits", "health_check", "static_root", "hsts"].map((k) =>
        `<tr><td>${k}</td><td>${app[k] ? "<code>" + escape(JSON.stringify(app[k])) + "</code>" : '<span class="muted">off</span>'}</td></tr>`).join("")}
        <tr><td>https_redirect</td><td>${app.https_redirect ? "on" : '<span class="muted">off</span>'}</td></tr></table>
      <h2>Switches</h2><table id="switches">${switchRows(app)}</table>
      <h2>Counters</h2><table>${Object.entries(counters).map(([series, value]) =>
        `<tr><td><code>${escape(series.replace(`app="${name}",`, "").replace(`,app="${name}"`, "").replace(`app="${name}"`, ""))}</code></td><td>${value}</td></tr>`).join("")}</table>
      <h2>Certificates</h2><table><tr><th>domain</th><th>expires</th><th>issuer</th><th>ACME</th></tr>${(app.domains || []).map((d, i) => {
        const c = certs[i];
        return `<tr><td>${escape(d)}</td><td>${c && c.not_after ? escape(date(c.not_after)) : '<span class="muted">none stored</span>'}</td>
          <td>${escape(c && c.issuer)}</td><td>${acmeState(c && c.acme)}</td></tr>`;
      }).join("")}</table>
      <h2>Recent changes</h2>${auditTable(audit)}`;
  };
  await tick();
  refresh = setInterval(() => tick().catch(showError), 2000);
}

// The app's writes from the audit log: who (token id), from where, what and which fields.
function auditTable(audit) {
  if (!audit) return `<p class="muted">The audit log is not readable with this token.</p>`;
  if (!audit.records.length) return `<p class="muted">No write to this app is recorded.</p>`;
  const rows = audit.records.map((r) => `<tr><td>${escape(new Date(r.at_ms).toLocaleString())}</td>
    <td><code>${escape(r.token)}</code></td><td>${escape(r.client)}</td><td>${escape(r.method)} ${escape(r.path)}</td>
    <td class="${r.status < 400 ? "ok" : "bad"}">${r.status}</td><td>${Object.keys(r.change || {}).map(escape).join(", ")}</td></tr>`).join("");
  return `<table id="app-audit"><tr><th>when</th><th>token</th><th>from</th><th>call</th><th>answer</th><th>fields changed</th></tr>${rows}</table>`;
}

// Writes, shown only when the router allows the dashboard to write: the app as JSON to edit
// and save (the same document `switchyard apps get --output json` prints and `apps put -f`
// reads), and a purge of its cached responses. Kept outside the refreshing part of the
// page, so a refresh never wipes an edit under way.
async function editPanel(name) {
  const panel = document.getElementById("edit");
  panel.innerHTML = `<h2>Change</h2><p><button id="edit-app">Edit as JSON</button>
    <button id="purge-cache">Purge cached responses</button> <span id="write-result"></span></p>
    <div id="editor" hidden><textarea id="app-json" rows="18" cols="100" spellcheck="false"></textarea>
    <p><button id="save-app">Save</button></p></div>`;
  const result = document.getElementById("write-result");
  const report = (ok, text) => { result.className = ok ? "ok" : "bad"; result.textContent = text; };
  document.getElementById("edit-app").onclick = async () => {
    const app = await api("/v1/apps/" + encodeURIComponent(name));
    delete app.resolved_backends;
    document.getElementById("app-json").value = JSON.stringify(app, null, 2);
    document.getElementById("editor").hidden = false;
  };
  document.getElementById("save-app").onclick = async () => {
    let body;
    try { body = JSON.stringify(JSON.parse(document.getElementById("app-json").value)); }
    catch (error) { report(false, "not JSON: " + error.message); return; }
    try {
      await api("/v1/apps/" + encodeURIComponent(name), false, { method: "PUT", body });
      report(true, "saved: routing follows now");
      document.getElementById("editor").hidden = true;
    } catch (error) { report(false, "refused: " + error.message); }
  };
  document.getElementById("purge-cache").onclick = async () => {
    try {
      const answer = await api(`/v1/apps/${encodeURIComponent(name)}/cache?path=/&prefix=true`, false, { method: "DELETE" });
      report(true, `purged${answer.deleted !== undefined ? ": " + answer.deleted + " responses" : ""}`);
    } catch (error) { report(false, "refused: " + error.message); }
  };
}

function acmeState(acme) {
  if (!acme) return "";
  const parts = [acme.status];
  if (acme.reason) parts.push(acme.reason);
  if (acme.next_try_unix) parts.push("next try " + date(acme.next_try_unix));
  if (acme.renew_at_unix && acme.status === "issued") parts.push("renews " + date(acme.renew_at_unix));
  return `<span class="${acme.status === "failed" ? "bad" : acme.status === "issued" ? "ok" : ""}">${escape(parts.join(" · "))}</span>`;
}

/** The app's per-app switches, one row each; password hashes are never shown. */
function switchRows(app) {
  const shown = (value) => "<code>" + escape(JSON.stringify(value)) + "</code>";
  const off = '<span class="muted">off</span>';
  const auth = app.basic_auth && {
    realm: app.basic_auth.realm,
    users: Object.keys(app.basic_auth.users || {}),
    open_paths: app.basic_auth.open_paths || [],
  };
  const maintenance = app.maintenance && (app.maintenance.enabled
    ? `<span class="bad">on</span> (503${app.maintenance.retry_after_s ? ", Retry-After " + app.maintenance.retry_after_s + " s" : ""}${app.maintenance.page_html ? ", the app's page" : ""})`
    : "ready, off");
  const rows = [
    ["redirects", app.redirects && app.redirects.length ? shown(app.redirects) : off],
    ["maintenance", maintenance || off],
    ["error_pages", app.error_pages ? escape(Object.keys(app.error_pages).join(", ")) : off],
    ["headers", app.headers ? shown(app.headers) : off],
    ["basic_auth", auth ? shown(auth) : off],
    ["affinity", app.affinity ? shown(app.affinity) : off],
    ["compress", app.compress ? shown(app.compress) : off],
    ["x_forwarded_host", app.forwarding && app.forwarding.x_forwarded_host ? "on" : off],
    ["advertise_http3", app.advertise_http3 === false ? "off (no Alt-Svc)" : "on"],
    ["proxy_protocol", app.forwarding && app.forwarding.proxy_protocol ? "v" + escape(String(app.forwarding.proxy_protocol)) : off],
  ];
  return rows.map(([name, value]) => `<tr><td>${name}</td><td>${value}</td></tr>`).join("");
}

function backendState(b) {
  if (b.retired) return "retired (draining)";
  if (b.failing_checks) return "down (failing health checks)";
  if (b.passively_down) return "down (refused a connection)";
  return "healthy";
}

async function explain(params) {
  const host = params.get("host") || "";
  const path = params.get("path") || "/";
  view.innerHTML = `<h1>Explain a host</h1><form id="explain"><input name="host" size="36" placeholder="host" value="${escape(host)}">
    <input name="path" size="30" value="${escape(path)}"> <button>Explain</button></form><div id="answer"></div>`;
  document.getElementById("explain").onsubmit = (e) => {
    e.preventDefault();
    const form = new FormData(e.target);
    location.hash = `#/explain?host=${encodeURIComponent(form.get("host"))}&path=${encodeURIComponent(form.get("path"))}`;
  };
  if (!host) return;
  const a = await api(`/v1/explain?host=${encodeURIComponent(host)}&path=${encodeURIComponent(path)}`);
  const answer = document.getElementById("answer");
  if (!a.app) { answer.innerHTML = `<p><strong>${escape(a.host)}</strong>: no app. ${escape(a.why)}</p>`; return; }
  answer.innerHTML = `<p id="verdict"><strong>${escape(a.host)}${escape(a.path)}</strong> → app
    <a href="#/app/${encodeURIComponent(a.app)}">${escape(a.app)}</a> by the <strong>${escape(a.rule)}</strong> rule
    <code>${escape(a.domain)}</code> <span class="muted">(looked up: ${a.tried.map(escape).join(", ")})</span></p>
    <h2>Stages</h2><table>${a.stages.map((s) => `<tr><td>${escape(s.stage)}</td><td class="${s.applies ? "ok" : "muted"}">${s.applies ? "applies" : "skipped"}</td><td>${escape(s.why)}</td></tr>`).join("")}</table>
    ${storedCopies(a.stored)}
    <h2>Next backend</h2><p><code>${escape(a.backend.next || "none")}</code> — ${escape(a.backend.why)}</p>`;
}

// The response cache's copies of the explained path: age, freshness and what decided it.
function storedCopies(stored) {
  if (!stored) return "";
  if (!stored.length) return `<h2>Cached copies</h2><p class="muted">none stored for this path</p>`;
  return `<h2>Cached copies</h2><table id="stored"><tr><th>URL</th><th>age</th><th>lifetime</th><th>decided by</th><th>state</th></tr>${stored.map((c) => c.varies_by
    ? `<tr><td>${escape(c.url)}</td><td colspan="4">${escape(c.why)}: ${c.varies_by.map(escape).join(", ")}</td></tr>`
    : `<tr><td>${escape(c.url)}</td><td>${c.age_s} s</td><td>${c.freshness_lifetime_s} s</td><td>${escape(c.decided_by)}</td><td>${escape(c.state)}</td></tr>`).join("")}</table>`;
}

// Certificates by expiry, soonest first, a page at a time from the store's expiry index;
// then the ACME orders that need a look (failing, waiting, or impossible).
async function certs(params) {
  const after = params.get("after");
  view.innerHTML = `<h1>Certificates</h1><div id="certs">Loading…</div><h2>ACME orders not issued</h2><div id="acme">Loading…</div>`;
  const [page, acme] = await Promise.all([
    api("/v1/certs?order=expiry&limit=100" + (after ? "&after=" + encodeURIComponent(after) : "")),
    api("/v1/acme?status=failed,pending,validating,unsupported&limit=100"),
  ]);
  const now = Date.now();
  const rows = page.certs.map((c) => {
    const days = Math.floor((c.not_after * 1000 - now) / 86400000);
    return `<tr><td>${escape(c.domain)}</td><td>${escape(date(c.not_after))}</td><td class="${days < 14 ? "bad" : "ok"}">${Number.isFinite(days) ? days : "?"}</td><td>${escape(c.issuer)}</td><td>${c.acme ? acmeState(c.acme) : '<span class="muted">uploaded</span>'}</td></tr>`;
  }).join("");
  document.getElementById("certs").innerHTML = page.certs.length
    ? `<table id="cert-list"><tr><th>domain</th><th>expires</th><th>days left</th><th>issuer</th><th>ACME</th></tr>${rows}</table>
      <p>${after ? '<a href="#/certs">soonest first</a> · ' : ""}${page.next_after ? `<a href="#/certs?after=${encodeURIComponent(page.next_after)}">later ones</a>` : '<span class="muted">no later ones</span>'}</p>`
    : `<p class="muted">${after ? "No later certificate." : "No certificate is stored."}</p>`;
  document.getElementById("acme").innerHTML = acme.domains.length
    ? `<table><tr><th>domain</th><th>state</th><th>failed orders in a row</th></tr>${acme.domains.map((d) =>
      `<tr><td>${escape(d.domain)}</td><td>${acmeState(d)}</td><td>${d.attempts}</td></tr>`).join("")}</table>
      ${acme.next_after ? `<p class="muted">More after ${escape(acme.next_after)} (${acme.scanned} read).</p>` : ""}`
    : `<p class="muted">No ACME order is failing or waiting. ${acme.lease ? "Issuing: " + escape(acme.lease.holder) + "." : "No router holds the issuing lease (ACME off, or nothing ordered yet)."}</p>`;
}

// The stored proxy-wasm modules, by name, and which of the apps on the page run each
// (`explain` shows an app's filters with their failures and last error).
async function filters() {
  view.innerHTML = `<h1>Filters</h1><div id="filters">Loading…</div>`;
  const stored = await api("/v1/filters");
  document.getElementById("filters").innerHTML = stored.length
    ? `<table id="filter-list"><tr><th>name</th><th>SHA-256</th><th>size</th><th>stored</th></tr>${stored.map((f) =>
      `<tr><td>${escape(f.name)}</td><td><code>${escape(f.sha256.slice(0, 16))}…</code></td><td>${(f.size / 1024).toFixed(1)} KiB</td><td>${escape(date(f.updated_unix))}</td></tr>`).join("")}</table>
      <p class="muted">Upload with <code>switchyard filters put NAME FILE</code>; an app runs them with its <code>filters</code> setting; <a href="#/explain">explain</a> a host to see its filters' failures.</p>`
    : `<p class="muted">No filter is stored. Upload one with <code>switchyard filters put NAME FILE</code>.</p>`;
}

function date(unixSeconds) {
  return new Date(unixSeconds * 1000).toISOString().slice(0, 16).replace("T", " ") + " UTC";
}

function showError(error) {
  statusLine.textContent = "error: " + error.message;
}

async function route() {
  clearInterval(refresh);
  previous = null;
  statusLine.textContent = "";
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  const params = new URLSearchParams(query || "");
  try {
    if (!settings) settings = await api("/v1/ui/settings");
    if (path.startsWith("/app/")) await appPage(decodeURIComponent(path.slice(5)));
    else if (path === "/apps") await apps(params);
    else if (path === "/explain") await explain(params);
    else if (path === "/certs") await certs(params);
    else if (path === "/filters") await filters();
    else await overview();
    statusLine.textContent = "updated " + new Date().toLocaleTimeString();
  } catch (error) {
    showError(error);
  }
}

window.addEventListener("hashchange", route);
route();
