#!/usr/bin/env python3
"""bench/RESULTS.md: rendered from the last full results (bench/results/latest.json), one
section per benchmark script; a script adds its section with merge_section."""

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import HOT_HOST, ROOT, THREADS, Started, host


def write_report(results, path):
    m = results["machine"]
    lines = [
        "# Benchmark results",
        "",
        f"Measured by `bench/run` on {results['date']}. Machine: {m['cpu']}, {m['cores']} cores, "
        f"{m['memory_gib']} GiB, Linux {m['kernel']}. The load generator runs on the same 2 cores as "
        f"the proxy under test, so absolute figures are low and the ratios are what matter.",
        "",
        "Versions: " + "; ".join(f"{k} {v}" for k, v in m["versions"].items()),
        "",
        f"Every proxy: {THREADS} worker threads/processes, access log off, keep-alive to the "
        "backends, the same backend (an nginx answering a 3-byte body). Apps: "
        f"{results['apps_for_load']} stored, all traffic for `{HOT_HOST}`.",
        "",
        "## Closed-loop max throughput (wrk -t2 -c64)",
        "",
        "| proxy | req/s | vs nginx | errors |",
        "|---|---|---|---|",
    ]
    base = results["throughput"]["nginx"]["rps"]
    for name, t in results["throughput"].items():
        lines.append(f"| {name} | {t['rps']:.0f} | {t['rps'] / base:.2f}× | {'; '.join(t['errors']) or 'none'} |")
    lines += ["", "## Constant-rate latency (vegeta, open loop: no coordinated omission)", "",
              "| proxy | rate | mean ms | p50 ms | p99 ms | max ms | success |", "|---|---|---|---|---|---|---|"]
    for name, runs in results["latency"].items():
        for r in runs:
            lines.append(f"| {name} | {r['rate']} | {r['mean_ms']:.3f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
                         f"{r['max_ms']:.2f} | {r['success'] * 100:.1f}% |")
    lines += ["", "## Route change → new backend answering",
              "", "From the start of the change (Switchyard: admin PUT of the backends; nginx: rewrite the "
              "app's file and SIGHUP) until a new connection for that host is answered by the new backend.",
              "", "| proxy | apps stored | changes | p50 ms | p99 ms | max ms |", "|---|---|---|---|---|---|"]
    for r in results["route_change"]:
        lines.append(f"| {r['proxy']} | {r['apps']} | {r['n']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['max_ms']:.2f} |")
    if results.get("nginx_start"):
        lines += ["", "nginx start-up with its per-app files: " + ", ".join(
            f"{k} apps {v:.1f} s" for k, v in results["nginx_start"].items()) + "."]
    mem = results.get("memory")
    if mem:
        lines += ["", f"## Memory at {mem['apps']} stored apps (Switchyard)", "",
                  "| state | RSS MiB | per stored app |", "|---|---|---|",
                  f"| no apps, after the throughput run | {mem['rss_empty_kib'] / 1024:.1f} | |",
                  f"| {mem['apps']} apps, idle (routes are loaded lazily) | {mem['rss_idle_kib'] / 1024:.1f} | "
                  f"{(mem['rss_idle_kib'] - mem['rss_empty_kib']) * 1024 / mem['apps']:.0f} B |",
                  f"| after requesting every app once ({mem['apps_cached']:.0f} apps in the route cache) | "
                  f"{mem['rss_touched_kib'] / 1024:.1f} | "
                  f"{(mem['rss_touched_kib'] - mem['rss_empty_kib']) * 1024 / mem['apps']:.0f} B |"]
    lines += ["", "## Targets (issue 2)", ""]
    for t in results["targets"]:
        lines.append(f"- {t['name']}: measured {t['measured']} → **{'met' if t['met'] else 'NOT met'}**")
    def when(key):
        """When a section was measured, and where when it was not the machine above."""
        host = results.get(f"{key}_host")
        header = f"{m['cpu']}, {m['cores']} cores, kernel {m['kernel']}"
        where = "same machine" if not host or host["machine"] == header else (
            f"on another machine: {host['machine']}, commit {host['commit']}")
        return f"{results.get(f'{key}_date', '')}, {where}"

    if results.get("engines"):
        lines += engines_report(results["engines"], when("engines"))
    if results.get("https"):
        lines += https_report(results["https"], when("https"))
    if results.get("fleet"):
        lines += fleet_report(results["fleet"], when("fleet"))
    if results.get("mirror"):
        lines += mirror_report(results["mirror"], when("mirror"))
    if results.get("cache"):
        lines += cache_report(results["cache"], when("cache"))
    if results.get("waf"):
        lines += waf_report(results["waf"], when("waf"))
    if results.get("logd"):
        lines += logd_report(results["logd"], when("logd"))
    if results.get("images"):
        lines += images_report(results["images"], when("images"))
    if results.get("acme"):
        lines += acme_report(results["acme"], when("acme"))
    if results.get("limits"):
        lines += limits_report(results["limits"], when("limits"))
    if results.get("sentinel"):
        lines += sentinel_report(results["sentinel"], when("sentinel"))
    if results.get("operator"):
        lines += operator_report(results["operator"], when("operator"))
    lines.append("")
    path.write_text("\n".join(lines))


def engines_report(e, date):
    """The headline of bench/engines/run.py; the whole report and its reading are in
    bench/ENGINE.md."""
    nginx = e["proxies"].get("nginx")
    lines = ["", "# Cost of a request and of a connection (bench/engines/run.py, issue 17)", "",
             f"Measured {date}, Switchyard at {e['commit']}; tables, floors and the engine decision "
             "in `bench/ENGINE.md`.", "",
             "| proxy | CPU µs/req HTTP | HTTPS keep-alive | HTTPS new conn | closed-loop req/s | "
             "backend conns / 10k | KiB per idle WebSocket |",
             "|---|---|---|---|---|---|---|"]
    for name, r in e["proxies"].items():
        def cell(value, base):
            return f"{value:.0f} ({value / base:.2f}×)" if base else f"{value:.0f}"
        # A target without HTTPS has no HTTPS runs.
        row = [cell(r[k]["cpu_us_per_request"], nginx and nginx[k]["cpu_us_per_request"])
               if r[k] else "not served"
               for k in ("constant_rate", "https_keepalive", "https_new_connection")]
        lines.append(f"| {name} | {' | '.join(row)} | "
                     f"{cell(r['closed_loop']['median_rps'], nginx and nginx['closed_loop']['median_rps'])} | "
                     f"{r['constant_rate']['backend_connections_per_10k']:.1f} | "
                     f"{cell(r['websocket_memory']['bytes_per_connection'] / 1024, nginx and nginx['websocket_memory']['bytes_per_connection'] / 1024)} |")
    if e.get("cached_app_memory"):
        lines += ["", cached_app_memory_sentence(e["cached_app_memory"])]
    return lines


def cached_app_memory_sentence(apps):
    """bench/engines/run.py's measurement of memory per cached app, in words."""
    return (f"Switchyard's resident memory per cached app: {apps['bytes_per_app']:.0f} B at {apps['apps']} "
            f"stored apps, {apps['apps_cached']:.0f} of them in the route cache after each was requested "
            f"once (issue 17's target: ≤ 1024 B; issue 2's section measures the same way).")


def merge_section(key, section, quick):
    """Adds one script's results (`key`) to the last full results and rewrites the report."""
    results_dir = ROOT / "bench" / "results"
    latest = results_dir / ("quick.json" if quick else "latest.json")
    source = latest if latest.exists() else results_dir / "latest.json"
    if not source.exists():
        print("no earlier results to merge into; run bench/bench_http.py first", file=sys.stderr)
        return False
    merged = json.loads(source.read_text())
    merged[key] = section
    merged[f"{key}_date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    merged[f"{key}_host"] = host()
    latest.write_text(json.dumps(merged, indent=2))
    out = ROOT / "bench" / ("RESULTS-quick.md" if quick else "RESULTS.md")
    write_report(merged, out)
    print(f"wrote {out}")
    return True


def fleet_report(f, date):
    """The fleet-mode section, from bench/bench_fleet.py's measurements."""
    lines = ["", "# Fleet mode: Redis store (bench/bench_fleet.py)", "",
             f"Measured on {date}; Redis 7 on loopback, no persistence.", "",
             "## Change propagation across two routers", "",
             "From the start of a PUT of an app's backends on router A until a new connection to "
             "router B is answered by the new backend.", "",
             "| router B | apps stored | changes | p50 ms | p99 ms | max ms |", "|---|---|---|---|---|---|"]
    for r in f["propagation"]:
        lines.append(f"| {r.get('router', 'switchyard')} | {r['apps']} | {r['n']} | {r['p50_ms']:.2f} | "
                     f"{r['p99_ms']:.2f} | {r['max_ms']:.2f} |")
    lines += ["", "## Throughput by store", "",
              "| store | warm cache, one host (wrk -t2 -c64) req/s | cold cache, walking "
              f"{f['cold']['redis']['apps']} hosts (wrk -t1 -c32) req/s |", "|---|---|---|"]
    for store in f["throughput"]:
        label = "nginx+Lua (Redis, LRU, Pub/Sub)" if store == "nginx+lua" else f"switchyard, {store} store"
        lines.append(f"| {label} | {f['throughput'][store]['rps']:.0f} | {f['cold'][store]['rps']:.0f} |")
    ours = [r for r in f["propagation"] if r.get("router", "switchyard") == "switchyard"]
    biggest = max(ours, key=lambda r: r["apps"])
    warm = f["throughput"]["redis"]["rps"] / f["throughput"]["embedded"]["rps"]
    targets = [(f"propagation p99 < 10 ms at {biggest['apps']} apps", f"{biggest['p99_ms']:.2f} ms",
                biggest["p99_ms"] < 10),
               ("warm-cache throughput within 5% of the embedded store", f"{warm:.3f}×", warm >= 0.95),
               ]
    if "nginx+lua" in f["throughput"]:
        lua = f["throughput"]["redis"]["rps"] / f["throughput"]["nginx+lua"]["rps"]
        targets.append(("warm throughput ≥ 1.5× the nginx+Lua router", f"{lua:.2f}×", lua >= 1.5))
    lines += ["", "## Targets (issue 4)", ""]
    for name, measured, met in targets:
        lines.append(f"- {name}: measured {measured} → **{'met' if met else 'NOT met'}**")
    return lines


def https_report(h, date):
    """The HTTPS section, from bench/bench_https.py's measurements."""
    lines = ["", "# HTTPS (bench/bench_https.py)", "",
             f"Measured on {date}. {h['apps']} apps, each with its own certificate "
             "(EC P-256): Switchyard reads them from its store on first use; nginx has one server "
             "block and certificate file per app. HTTP/1.1 over TLS; vegeta's Go client keeps no "
             "session cache, so without keep-alive every request is a full TLS 1.3 handshake.",
             "", "## Full-handshake rate (closed loop: vegeta max rate, 64 workers, no keep-alive)", "",
             "| proxy | handshakes+requests/s | vs nginx | success |", "|---|---|---|---|"]
    base = h["handshake_rate"]["nginx"]["achieved_rps"]
    for name, r in h["handshake_rate"].items():
        lines.append(f"| {name} | {r['achieved_rps']:.0f} | {r['achieved_rps'] / base:.2f}× | {r['success'] * 100:.1f}% |")
    lines += ["", "## Constant-rate HTTPS latency (vegeta, open loop)", "",
              "| proxy | connections | rate | mean ms | p50 ms | p99 ms | max ms | success |",
              "|---|---|---|---|---|---|---|---|"]
    for name, runs in h["latency"].items():
        for r in runs:
            mode = "keep-alive" if r["keepalive"] else "new per request"
            lines.append(f"| {name} | {mode} | {r['rate']} | {r['mean_ms']:.3f} | {r['p50_ms']:.3f} | "
                         f"{r['p99_ms']:.3f} | {r['max_ms']:.2f} | {r['success'] * 100:.1f}% |")
    lines += ["", "## Switchyard start-up and memory with certificates stored", "",
              "From process start to the first HTTPS answer for the last stored domain (a cold "
              "certificate), and resident memory then.", "",
              "| certificates stored | start-up ms | RSS MiB |", "|---|---|---|"]
    for r in h["startup"]:
        lines.append(f"| {r['certs']} | {r['startup_s'] * 1000:.0f} | {r['rss_kib'] / 1024:.1f} |")
    cw = h.get("cold_vs_warm")
    if cw:
        lines += ["", f"## Cold vs warm certificate ({cw['names']} names, handshake time)", "",
                  "| certificate | p50 ms | p99 ms |", "|---|---|---|",
                  f"| cold (first handshake: store read + parse) | {cw['cold']['p50_ms']:.2f} | {cw['cold']['p99_ms']:.2f} |",
                  f"| warm (cached) | {cw['warm']['p50_ms']:.2f} | {cw['warm']['p99_ms']:.2f} |"]
    lines += ["", "## Targets (issue 3)", ""]
    ratio = h["handshake_rate"]["switchyard"]["achieved_rps"] / base
    targets = [("full-handshake rate ≥ nginx's", f"{ratio:.2f}×", ratio >= 1.0)]
    biggest = max(h["startup"], key=lambda r: r["certs"])
    targets.append((f"start-up < 1 s with {biggest['certs']} certificates stored",
                    f"{biggest['startup_s'] * 1000:.0f} ms", biggest["startup_s"] < 1.0))
    if cw:
        extra = cw["cold"]["p50_ms"] - cw["warm"]["p50_ms"]
        targets.append(("cold certificate adds < 5 ms over a warm one (p50)", f"{extra:.2f} ms", extra < 5))
    for name, measured, met in targets:
        lines.append(f"- {name}: measured {measured} → **{'met' if met else 'NOT met'}**")
    return lines


def mirror_report(m, date):
    """The mirroring section, from bench/bench_mirror.py's measurements."""
    lines = ["", "# Traffic mirroring (bench/bench_mirror.py)", "",
             f"Measured on {date}. Seed 003's experiment: {m['rate']} req/s for "
             f"{m['seconds']} s through each proxy to one primary, with no mirror, a healthy mirror, a "
             "mirror answering 500, and a mirror answering after 1 s. \"One connection\" is the "
             "article's `hey -c 1 -q 1000 -t 1` (one keep-alive connection, next request when the "
             "answer arrives, 1 s timeout); \"open loop\" is vegeta at a fixed rate over as many "
             "connections as needed. Switchyard mirrors 100% with `max_in_flight` 2000; nginx uses "
             "`mirror` + `proxy_pass` to the same shadows.", "",
             "| proxy | mirror | load | achieved req/s | mean ms | p50 ms | p99 ms | success | copies delivered / dropped |",
             "|---|---|---|---|---|---|---|---|---|"]
    # "–": none (the light route alone), or none reported by wrk.
    for r in m["runs"]:
        copies = f"{r['mirrored']:.0f} / {r['dropped']:.0f}" if "mirrored" in r else ""
        lines.append(f"| {r['proxy']} | {r['scenario']} | {r['mode']} | {r['achieved_rps']:.1f} | "
                     f"{r['mean_ms']:.3f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
                     f"{r['success'] * 100:.1f}% | {copies} |")
    lines += ["", "## Target (issue 5)", ""]
    for mode in ("one connection", "open loop"):
        runs = {r["scenario"]: r for r in m["runs"] if r["proxy"] == "switchyard" and r["mode"] == mode}
        if "none" not in runs or "slow" not in runs:
            continue
        rate = runs["slow"]["achieved_rps"] / runs["none"]["achieved_rps"]
        p99 = runs["slow"]["p99_ms"] / runs["none"]["p99_ms"]
        met = rate >= 0.95 and p99 <= 1.05
        lines.append(f"- {mode}, 1 s mirror vs no mirror, achieved rate and p99 within 5%: measured "
                     f"rate {rate:.3f}×, p99 {p99:.3f}× → **{'met' if met else 'NOT met'}**")
        if "healthy" in runs:
            slow_vs_healthy = runs["slow"]["p99_ms"] / runs["healthy"]["p99_ms"]
            lines.append(f"  - what the mirror's slowness itself costs (1 s mirror vs healthy mirror): "
                         f"p99 {slow_vs_healthy:.3f}× (1,000 copies held open at once on the same 2 cores)")
    return lines


def cache_report(c, date):
    """The response-cache section, from bench/bench_cache.py's measurements."""
    lines = ["", "# Response cache (bench/bench_cache.py)", "",
             f"Measured on {date}. Seed 004's experiment: a deliberately slow app "
             "(one request at a time, 10 ms per 5 KB page, like a single Rails worker) behind Switchyard without a cache, with its memory "
             "cache, with the shared `redis` store (copies kept in Redis by the router), with the "
             "`redis-versioned` store (the page written to Redis as the article's "
             "Rails module writes it), and behind nginx `proxy_cache`. Closed loop: `wrk -t2 -c100` "
             f"for {c['seconds']} s (the article's `ab -c 100`, time-bound), each cached setup "
             "measured three times, interleaved with the others, median reported (single runs "
             "swing by ±20% on two shared cores); open loop: vegeta at "
             f"{c['rate']} req/s.", "",
             "| setup | closed-loop req/s (median) | runs | vs uncached | errors | open-loop achieved req/s | mean ms | p99 ms | success |",
             "|---|---|---|---|---|---|---|---|---|"]
    runs = {r["setup"]: r for r in c["runs"]}
    base = runs["switchyard, no cache"]["rps"]
    for r in c["runs"]:
        open_loop = (f"{r['achieved_rps']:.0f} | {r['mean_ms']:.3f} | {r['p99_ms']:.3f} | {r['success'] * 100:.1f}%"
                     if "achieved_rps" in r else "not run (the app alone serves ~100 req/s) | | |")
        runs_text = " / ".join(f"{x:.0f}" for x in r.get("rps_runs", [r["rps"]]))
        lines.append(f"| {r['setup']} | {r['rps']:.0f} | {runs_text} | {r['rps'] / base:.1f}× | "
                     f"{'; '.join(r['errors']) or 'none'} | "
                     f"{open_loop} |")
    lines += ["", "## Targets (issue 6)", ""]
    nginx = runs.get("nginx proxy_cache")
    for name in ("switchyard, memory cache", "switchyard, redis (shared)", "switchyard, redis-versioned"):
        if name not in runs:
            continue
        hit = runs[name]["rps"]
        lines.append(f"- {name}: hit throughput ≥ 10× uncached: measured {hit / base:.1f}× → "
                     f"**{'met' if hit >= 10 * base else 'NOT met'}**")
        if nginx:
            lines.append(f"- {name}: hit throughput ≥ nginx proxy_cache: measured {hit / nginx['rps']:.2f}× → "
                         f"**{'met' if hit >= nginx['rps'] else 'NOT met'}**")
    return lines


def isolation_table(section, heavy, rate_label, rate):
    """Seed 001's table: for the pool and the inline router, the light route alone and beside
    N `heavy` connections, light and heavy latency, timeouts and errors."""
    def ms(value):
        # wrk prints 0 when it recorded no latency (its blocked connections timed out).
        return "–" if not value else f"{value:.1f}"
    lines = [f"| mode | {heavy} connections | light p50 ms | light p99 ms | light timeouts/errors | "
             f"{rate_label} | heavy p50 ms | heavy p99 ms | heavy errors |",
             "|---|---|---|---|---|---|---|---|---|"]
    default = ("pool (SCHED_IDLE workers that give way)" if section.get("isolation_idle_kernel")
               else "pool (SCHED_IDLE workers)" if section.get("isolation_nice") else "pool")
    for mode, key in ((default, "isolation"),
                      ("pool, heavy clients honour Retry-After", "isolation_retry_after"),
                      ("pool, SCHED_IDLE alone", "isolation_idle_kernel"),
                      ("pool, nice 10", "isolation_nice"), ("pool, nice 10, pinned", "isolation_pinned"),
                      ("inline", "isolation_inline")):
        for r in section.get(key, []):
            lines.append(f"| {mode} | {r['connections'] or 'none'} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                         f"{(1 - r['success']) * 100:.2f}% | {rate(r)} | {ms(r.get('heavy_p50_ms'))} | "
                         f"{ms(r.get('heavy_p99_ms'))} | {'; '.join(r['heavy_errors']) or 'none'} |")
    return lines


def pool_outcomes_table(section):
    """What the pool did with each row's heavy requests, where the run counted it (the
    router's metrics before and after the row)."""
    rows = [(mode, r) for mode, key in (("pool", "isolation"),
                                        ("pool, heavy clients honour Retry-After", "isolation_retry_after"))
            for r in section.get(key, []) if r.get("pool")]
    if not rows:
        return []
    lines = ["", "The pool's counts of those heavy requests, per row: inspected; refused before "
             "queueing (503 + Retry-After at once); shed from the queue when the work ahead of them "
             "came to pass their deadline (503 + Retry-After before it); timed out (503 at the "
             "5 s deadline, which wrk counts as a timeout).", "",
             "| mode | heavy connections | inspected | refused early | shed | timed out |",
             "|---|---|---|---|---|---|"]
    for mode, r in rows:
        p = r["pool"]
        lines.append(f"| {mode} | {r['connections']} | {p['inspected']:.0f} | {p['refused']:.0f} | "
                     f"{p['shed']:.0f} | {p['timed_out']:.0f} |")
    return lines


ISOLATION_KEYS = ("isolation", "isolation_retry_after", "isolation_idle_kernel", "isolation_nice",
                  "isolation_pinned", "isolation_inline")


def idle_p99s(section):
    """The light route's p99 alone, once per router the run started: the same route with no
    heavy load, whatever the pool's mode, so each is a sample of one idle value. On two
    shared cores one sample ranged 0.65–4.4 ms across runs (an idle VM's CPUs halt, and
    waking them is in the light route's p99), so the targets use their median."""
    return sorted(section[key][0]["p99_ms"] for key in ISOLATION_KEYS
                  if section.get(key) and section[key][0]["connections"] == 0)


def light_route_targets(section, key, heavy):
    """Seed 001's targets for a light route beside `heavy` connections: p99 within 1.5× of
    its idle value (the median of the run's alone samples; the ratio to this set's own alone
    row and to the lowest sample beside it), and no timeouts at the most connections."""
    isolation = section[key]
    samples = idle_p99s(section)
    idle = statistics.median(samples)
    lines = [f"- idle value: median of the run's {len(samples)} alone samples, {idle:.2f} ms "
             f"(samples {', '.join(f'{p:.2f}' for p in samples)} ms)"]
    for r in isolation[1:]:
        ratio = r["p99_ms"] / idle
        lines.append(f"- light p99 with {r['connections']} {heavy} connections ≤ 1.5× idle: measured "
                     f"{ratio:.2f}× ({r['p99_ms'] / isolation[0]['p99_ms']:.2f}× this set's alone row, "
                     f"{r['p99_ms'] / samples[0]:.2f}× the lowest sample) → "
                     f"**{'met' if ratio <= 1.5 else 'NOT met'}**")
    floor = section.get("idle_neighbour")
    if floor and key == "isolation":
        rounds = floor["rounds"]
        alone = ", ".join(f"{r['alone_p99_ms']:.2f}" for r in rounds)
        beside = ", ".join(f"{r['beside_p99_ms']:.2f}" for r in rounds)
        lines.append(f"- beside it, this machine's floor (no heavy request; {floor['spinners']} `SCHED_IDLE` "
                     f"processes burning CPU, as a pool's workers would): light p99 {floor['ratio']:.2f}× "
                     f"its alone value (medians of {len(rounds)} alternated rounds: alone {alone} ms, "
                     f"beside {beside} ms)")
    last = isolation[-1]
    lines.append(f"- 0% light timeouts at {last['connections']} {heavy} connections: measured "
                 f"{(1 - last['success']) * 100:.2f}% → **{'met' if last['success'] >= 1 else 'NOT met'}**")
    return lines


def ok_rps(measured):
    """2xx answers per second of a throughput run; runs from before 2xx were counted apart
    had only 2xx or listed the others in their errors."""
    return measured.get("ok_rps", measured["rps"])


def runs_of(measured):
    """' (a, b, c)': every run behind a median, when there were several."""
    runs = measured.get("ok_rps_runs", [])
    return f" ({', '.join(f'{r:.0f}' for r in runs)})" if len(runs) > 1 else ""


def waf_report(w, date):
    """The WAF section, from bench/bench_waf.py's measurements."""
    lines = ["", "# WAF and worker pool (bench/bench_waf.py)", "",
             f"Measured on {date}. Both proxies inspect with libmodsecurity 3.0.9 and "
             "Debian's OWASP CRS 3.3.4 (paranoia 1, request bodies inspected, block mode) in front of "
             "the same origin (an nginx answering 200 at once). Switchyard runs inspections on its "
             "worker pool (2 threads); nginx 1.22 uses libnginx-mod-http-modsecurity (2 workers). "
             f"Benign form POSTs, `wrk -t2 -c64` for {w['seconds']} s; with several alternated runs "
             "of each proxy, the median and (in brackets) every run.", "",
             "| body | Switchyard 2xx req/s | nginx + ModSecurity 2xx req/s | ratio | errors (Switchyard; nginx) |",
             "|---|---|---|---|---|"]
    ratios = []
    for r in w["throughput"]:
        sy, ng = ok_rps(r["switchyard"]), ok_rps(r["nginx"])
        ratio = sy / ng
        ratios.append((r["body_bytes"], ratio))
        lines.append(f"| {r['body_bytes'] // 1000} KB | {sy:.0f}{runs_of(r['switchyard'])} | "
                     f"{ng:.0f}{runs_of(r['nginx'])} | "
                     f"{ratio:.2f}× | {'; '.join(r['switchyard']['errors']) or 'none'}; "
                     f"{'; '.join(r['nginx']['errors']) or 'none'} |")
    cpu_rows = w.get("cpu_per_request", [])
    if cpu_rows:
        lines += ["", "CPU per inspected request at a constant rate (utime + stime of each proxy's processes ÷ "
                  "requests; vegeta, the median of alternated runs and every run): the steadier figure on two "
                  "shared cores.", "",
                  "| body | rate | Switchyard ms CPU/request | nginx + ModSecurity ms CPU/request | ratio | "
                  "success (Switchyard; nginx) |", "|---|---|---|---|---|---|"]
        for r in cpu_rows:
            sy, ng = r["switchyard"], r["nginx"]
            lines.append(f"| {r['body_bytes'] // 1000} KB | {r['rate']} req/s | {sy['cpu_ms']:.2f} "
                         f"({', '.join(f'{c:.2f}' for c in sy['cpu_ms_runs'])}) | {ng['cpu_ms']:.2f} "
                         f"({', '.join(f'{c:.2f}' for c in ng['cpu_ms_runs'])}) | "
                         f"{sy['cpu_ms'] / ng['cpu_ms']:.2f}× | {sy['success']:.3f}; {ng['success']:.3f} |")
    lines += ["", f"Seed 001's question: a light GET route (an app without the WAF) at a constant "
              f"{w['light_rate']} req/s (vegeta, 1 s timeout), alone and while wrk keeps N connections of "
              "50 KB inspected POSTs going through the same router; inspections on the worker pool, then "
              "the same with a router forced to inspect inline on its event loops (`SWITCHYARD_BENCH_POOL=inline`, before `--pool-mode inline`, "
              "what a router without a pool does). Heavy latency is wrk's time to the whole (small) "
              "answer.", ""]
    lines += isolation_table(w, "heavy", "heavy req/s", lambda r: f"{r['heavy_rps']:.0f}")
    lines += pool_outcomes_table(w)
    lines += ["", "## Targets (issue 22)", ""] + light_route_targets(w, "isolation", "heavy")
    if w.get("isolation_retry_after"):
        lines += ["", "With heavy clients that honour Retry-After:", ""]
        lines += light_route_targets(w, "isolation_retry_after", "heavy")
    burst = w.get("first_burst")
    if burst:
        # Earlier runs recorded the refusals split by reason, and no shed count.
        refused = burst.get("refused", burst.get("refused_early", 0) + burst.get("refused_full", 0))
        shed = f"{burst['shed']:.0f} shed before the deadline, " if "shed" in burst else ""
        lines.append(f"- heavy requests not queued to wait out their deadline by a router started a moment "
                     f"ago (its pool has timed nothing) met by {burst['connections']} connections at once "
                     f"for {w['seconds']} s: {burst['inspected']:.0f} inspected, {refused:.0f} refused "
                     f"early, {shed}{burst['timed_out']:.0f} refused at the deadline (wrk: "
                     f"{'; '.join(burst['wrk_errors']) or 'no errors'}) → "
                     f"**{'met' if burst['timed_out'] == 0 else 'NOT met'}**")
    counted = [r["pool"] for key in ("isolation", "isolation_retry_after") for r in w.get(key, [])
               if r.get("pool")]
    if counted:
        late = sum(p["timed_out"] for p in counted)
        lines.append(f"- heavy requests never answered only at their deadline beside the light route "
                     f"(the rows above, on the pool): {late:.0f} timed out, "
                     f"{sum(p['shed'] for p in counted):.0f} shed before it, "
                     f"{sum(p['refused'] for p in counted):.0f} refused before queueing → "
                     f"**{'met' if late == 0 else 'NOT met'}**")
    for size, ratio in ratios:
        lines.append(f"- WAF-inspected req/s ≥ 1.0× nginx + ModSecurity ({size // 1000} KB bodies): measured "
                     f"{ratio:.2f}× → **{'met' if ratio >= 1.0 else 'NOT met'}**")
    for r in w.get("cpu_per_request", []):
        lines.append(f"- beside it, the steadier figure: CPU per inspected request ({r['body_bytes'] // 1000} KB "
                     f"bodies at {r['rate']} req/s) {r['switchyard']['cpu_ms'] / r['nginx']['cpu_ms']:.2f}× "
                     f"nginx + ModSecurity's")
    lines += earlier_lines(w, lambda r: f"req/s ratios {r.get('throughput_ratios')}, light p99 ratios "
                           f"{r.get('light_p99_ratios')}")
    return lines


def earlier_lines(section, describe):
    """The earlier runs a section carries, one line each."""
    if not section.get("earlier_runs"):
        return []
    return ["", "Earlier runs (same machine):", ""] + [
        f"- {r['commit']} ({r['date']}): {describe(r)}" for r in section["earlier_runs"]]


def images_report(m, date):
    """The image-resizing section, from bench/bench_images.py's measurements."""
    lines = ["", "# Image resizing on the worker pool (bench/bench_images.py)", "",
             f"Measured on {date}. `GET {m['thumbnail']}`: a {m['width']}×{m['height']} JPEG "
             f"original ({m['original_bytes'] / 1000:.0f} KB) fetched from the app, decoded, shrunk and encoded "
             f"on the worker pool (2 threads). Alone, 64 connections: **{m['alone_rps']:.0f} thumbnails/s** "
             f"({'; '.join(m['alone_errors']) or 'no errors'}). Then seed 001's question: a light GET route "
             f"at a constant {m['light_rate']} req/s (vegeta, 1 s timeout), alone and while wrk keeps N "
             "connections asking for thumbnails; resizing on the worker pool, then the same with a "
             "router forced to resize inline on its event loops (`SWITCHYARD_BENCH_POOL=inline`, before `--pool-mode inline`). wrk is "
             "closed-loop: a client refused with 503 (Retry-After) asks again at once, so the "
             "refusals are part of the load; the rows 'heavy clients honour Retry-After' hold one "
             "next request back per refusal for Retry-After (1 s, jittered ±50%), as careful "
             "clients do.", ""]
    lines += isolation_table(m, "thumbnail", "thumbnails/s", lambda r: f"{r.get('thumbnails_per_s', 0):.0f}")
    lines += ["", "## Targets (issue 22, images)", ""] + light_route_targets(m, "isolation", "thumbnail")
    if m.get("isolation_retry_after"):
        lines += ["", "With thumbnail clients that honour Retry-After:", ""]
        lines += light_route_targets(m, "isolation_retry_after", "thumbnail")
    base = m.get("baseline")
    if base:
        ratio = m["alone_rps"] / base["alone_rps"]
        lines.append(f"- thumbnails/s ≥ 5× {base['commit']}'s (same run; {base['commit']} resizes with the image crate): "
                     f"{m['alone_rps']:.0f} vs {base['alone_rps']:.0f} = {ratio:.1f}× → "
                     f"**{'met' if ratio >= 5 else 'NOT met'}**")
        floor = m.get("decode_floor")
        if floor:
            lines.append(f"  - the decode floor: tjbench decodes this original at 3/8 scale {floor['tjbench_fps_per_core']:.0f} "
                         f"times a second on one core, so {floor['cpus']} CPUs doing nothing but decode make at most "
                         f"{floor['ceiling_per_s']:.0f}/s, while 5× is {5 * base['alone_rps']:.0f}/s: out of reach "
                         f"for any thumbnailer that decodes the original each time (libvips decodes with the same "
                         f"libjpeg-turbo); this run reached {m['alone_rps'] / floor['ceiling_per_s'] * 100:.0f}% of the floor")
    cpu = m.get("cpu_per_thumbnail")
    if cpu:
        this = cpu["routers"]["this build"]
        others = [(name, r) for name, r in cpu["routers"].items() if name != "this build"]
        line = (f"  - beside it, the steadier figure: CPU per thumbnail at a constant {cpu['rate']}/s, "
                f"{this['cpu_ms']:.1f} ms ({this['loops_ms']:.2f} ms of it on the event loops; runs "
                f"{', '.join(f'{c:.1f}' for c in this['cpu_ms_runs'])})")
        for name, r in others:
            line += (f", {name} {r['cpu_ms']:.1f} ms (runs {', '.join(f'{c:.1f}' for c in r['cpu_ms_runs'])}): "
                     f"{r['cpu_ms'] / this['cpu_ms']:.1f}× less CPU per thumbnail")
        lines.append(line)
    if m.get("alone_rps_idle_kernel"):
        lines.append(f"  - alone, SCHED_IDLE workers that never give way made {m['alone_rps_idle_kernel']:.0f}/s "
                     f"(the default gives way only beside light traffic, which this run has none of)")
    refusals = m.get("refusals")
    if refusals and refusals.get("refused"):
        # Runs before the probe told them apart counted every 503 as refused early.
        timed_out = refusals.get("timed_out")
        late = ("" if timed_out is None else
                f"; {timed_out} answered 503 only at their deadline"
                + (f" (p50 {refusals['timed_out_p50_ms']} ms)" if timed_out else ""))
        met = refusals["p99_ms"] < 5 and not timed_out
        lines.append(f"- heavy requests refused early in under 5 ms, never a timeout: {refusals['refused']} of "
                     f"{refusals['probes']} probes beside 400 connections"
                     + (f" (for an app whose resize deadline, {refusals['deadline_ms']} ms, the queue they keep "
                        "cannot meet)" if refusals.get("deadline_ms") else "")
                     + f" refused early, p50 {refusals['p50_ms']} ms, "
                     f"p99 {refusals['p99_ms']} ms, max {refusals['max_ms']} ms{late}; "
                     f"{refusals['served']} served → **{'met' if met else 'NOT met'}**")
    elif refusals and refusals.get("timed_out"):
        lines.append(f"- heavy requests refused early in under 5 ms, never a timeout: no probe of "
                     f"{refusals['probes']} beside 400 connections was refused early, {refusals['served']} served, "
                     f"{refusals['timed_out']} answered 503 only at its deadline (p50 {refusals['timed_out_p50_ms']} ms) "
                     "→ **NOT met**")
    elif refusals:
        lines.append(f"- heavy requests refused early: no probe was refused ({refusals})")
    lines += earlier_lines(m, lambda r: f"{r.get('alone_rps')} thumbnails/s, light p99 ratios "
                           f"{r.get('light_p99_ratios')}")
    return lines


def acme_report(a, date):
    """The certificate-automation section, from bench/bench_acme.py's measurements."""
    return ["", "# ACME certificates (bench/bench_acme.py)", "",
            f"Measured {date} against Pebble {a['pebble']} on loopback (validation at once: "
            "PEBBLE_VA_NOSLEEP), one router on the embedded store, eight orders at once.", "",
            "| domains | the first 1,000 stored after | all stored after | per certificate | "
            "orders issued (Pebble) | failed | RSS before → after |",
            "|---|---|---|---|---|---|---|",
            f"| {a['domains']} | {a.get('first_s', '–')} s | {a['issuing_s']} s | {a['ms_per_certificate']} ms | "
            f"{a['issued']:.0f} ({a['pebble_issued']}) | {a['failed']:.0f} | "
            f"{a['rss_before_kib']} → {a['rss_after_kib']} KiB |", "",
            f"| on that data ({a['domains']} apps, certificates and ACME records) | ACME on | ACME off |",
            "|---|---|---|",
            f"| start-up, exec to the admin API answering (median of 5) | {a['startup_ms_with_acme']} ms | "
            f"{a['startup_ms_without_acme']} ms |",
            f"| router CPU per handshake, random SNI names nobody owns (median of 3 rounds) | "
            f"{a.get('sni_flood_us_with_acme', '–')} µs | {a.get('sni_flood_us_without_acme', '–')} µs |", "",
            "Start-up reads no certificate and no ACME record (the issuer's first round runs after "
            "the listeners are up), and a handshake never looks at ACME state: names no app owns "
            "are never ordered (orders start from app changes and rounds over opted-in apps)."
            ] + seeded_startup_report(a.get("seeded_startup", []))


def seeded_startup_report(rows):
    """Start-up over many ACME-issued certificates (bench_acme's `bench-seed --acme` data)."""
    if not rows:
        return []
    lines = ["", "## Start-up with many ACME-issued certificates stored", "",
             "`bench-seed --acme`: opted-in apps, each with a certificate recorded as issued by the "
             "router's issuer (renewal due in 60 days). Exec to the first HTTPS answer for the last "
             "domain (a cold certificate), median of 3 starts; with ACME on, also until the issuer's "
             "first full round has counted every domain (nothing is due: orders made should be 0). "
             "bench_https' figure for issue 3 (121 ms at 100,000 uploaded certificates) was taken "
             "before the WAF loaded the OWASP CRS at start (about 130 ms of these figures: 39–59 ms "
             "with `--waf off` at 1,000 apps on 2026-11-25); ACME off is this run's baseline.", "",
             "| certificates | ACME | first HTTPS answer | RSS then | first round done | CPU until then | "
             "RSS after the round | orders made |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        on, off = row["on"], row["off"]
        lines.append(f"| {row['certificates']} | on | {on['first_https_ms']} ms | {on['rss_kib'] / 1024:.1f} MiB | "
                     f"{on['first_round_done_ms']} ms | {on['cpu_ms_until_round_done']} ms | "
                     f"{on['rss_after_round_kib'] / 1024:.1f} MiB | {on['orders']:.0f} |")
        lines.append(f"| {row['certificates']} | off | {off['first_https_ms']} ms | {off['rss_kib'] / 1024:.1f} MiB | "
                     f"– | {off['cpu_ms_at_first_answer']} ms (at the first answer) | – | – |")
    return lines


def limits_report(m, date):
    """The tenant-limits section, from bench/bench_limits.py's measurements."""
    cost, acc, iso, memory = m["cost"], m["accuracy"], m["isolation"], m["memory"]
    lines = ["", "# Tenant limits (bench/bench_limits.py)", "",
             f"Measured {date}. One router (2 threads, no access log) before an nginx origin; "
             "vegeta at a constant rate, wrk for the million clients.", "",
             "| measure | without | with | ratio | target |", "|---|---|---|---|---|",
             f"| router CPU per request at 2,000 req/s, every limit set, none reached (median of "
             f"{len(cost['rounds']['none'])}) | {cost['us_without']} µs | {cost['us_with']} µs | "
             f"{cost['ratio']}× | ≤ 1.05× |",
             f"| neighbour's p99 at 500 req/s, beside a 2,000 req/s flood of an app limited to "
             f"{iso['flood_limit']}/s (median of {iso.get('rounds', 1)}) | {iso['p99_ms_alone']} ms | {iso['p99_ms_flooded']} ms | "
             f"{iso['ratio']}× | ≤ 1.2× |",
             f"| the same, the flood's app without limits (for scale) | {iso['p99_ms_alone']} ms | "
             f"{iso.get('p99_ms_unlimited_flood', '–')} ms | {iso.get('ratio_unlimited', '–')}× | – |", "",
             f"Accuracy: a limit of {acc['limit_per_s']} req/s offered {acc['offered_per_s']} req/s admitted "
             f"{acc['admitted_per_s']} per second ({acc['error_pct']:+}%; target ± 5%); answers "
             f"{acc['status_codes']}.", "",
             "Memory with distinct client addresses (per-client limit by address; the client table "
             "holds at most `--limit-clients` = 100,000 records):", "",
             "| distinct clients seen | records held | router RSS |", "|---|---|---|"]
    for row in memory:
        lines.append(f"| {row['clients']:,} | {row['records']:,.0f} | {row['rss_kib'] / 1024:.1f} MiB |")
    if m.get("earlier_runs"):
        lines += ["", "Earlier runs (same machine; the p99 ratio swings run to run on 2 shared cores):", "",
                  "| commit | date | CPU ratio | admitted/s | neighbour p99 (limited flood) | (unlimited flood) "
                  "| RSS at 1M clients |", "|---|---|---|---|---|---|---|"]
        for r in m["earlier_runs"]:
            lines.append(f"| {r['commit']} | {r['date']} | {r['cpu_ratio']}× | {r['accuracy_admitted_per_s']} | "
                         f"{r['isolation_ratio']}× | {r['isolation_ratio_unlimited']}× | {r['rss_mib_at_1m_clients']} MiB |")
    return lines


def sentinel_report(s, date):
    """The Sentinel failover section, from bench/bench_sentinel.py's measurements."""
    lines = ["", "# Store failover behind Redis Sentinel (bench/bench_sentinel.py)", "",
             f"Measured {date}. Per round: a primary, a replica and three Sentinels "
             f"(`down-after-milliseconds` {s['down_after_ms']}), two routers on "
             f"`redis+sentinel://`, vegeta at {s['rate_per_router']} req/s to each router over 20 known "
             "hosts; the primary gets SIGKILL; times from the kill.", "",
             "| round | first successful write | change seen on the other router | writes refused (503) "
             "| slowest write | requests | failed |", "|---|---|---|---|---|---|---|"]
    for n, r in enumerate(s["rounds"], 1):
        lines.append(f"| {n} | {r['write_s']} s | {r['seen_on_other_router_s']} s | {r['writes_refused']} | "
                     f"{r['slowest_write_ms']} ms | {r['requests']:,} | {r['failed']} |")
    lines += ["", f"Median: writes resume {s['median_write_s']} s after the kill, the other router routes "
              f"by a new change {s['median_seen_s']} s after it; {s['failed_requests']} of "
              f"{s['requests']:,} requests failed (target: 0). Most of the time is the Sentinels' own: "
              f"{s['down_after_ms']} ms before they call the primary down, then their election."]
    return lines


def operator_report(o, date):
    """The operator's tools section, from bench/bench_operator.py's measurements."""
    lines = ["", "# Bulk import and traffic history (bench/bench_operator.py)", "",
             f"Measured {date}. `switchyard apps import FILE` (JSON lines, one app a line) into a "
             "fresh router; then the same file with one bad line in its middle.", "",
             "| store | apps | import s | host routed after | file with a bad line | refused in s | applied anyway |",
             "|---|---|---|---|---|---|---|"]
    for r in o["import"]:
        lines.append(f"| {r['store']} | {r['apps']} | {r['seconds']} | {r['routed_after']} | "
                     f"exit {r['bad_exit']}: {r['bad_message']} | {r['bad_refused_s']} | "
                     f"{'yes' if r['bad_partially_applied'] else 'no'} |")
    h = o["history"]
    lines += ["", f"Traffic history: {h['apps']} apps stored ({h['import_s']} s to import), {h['active']} asked "
              f"for once each: {h['tracked_apps']} apps kept, **{h['history_bytes'] / 1e6:.1f} MB** by the "
              f"router's own count (`switchyard_history_bytes`). The router's RSS at the end: "
              f"{h['rss_after_kib'] / 1024:.0f} MiB with the 10,000 active apps' routes built "
              f"({h['rss_before_traffic_kib'] / 1024:.0f} MiB just after the import, whose buffers "
              "were returned since).", "",
              ]
    c = o.get("cost")
    if c:
        lines += [f"CPU per proxied request at {c['rate']} req/s over {c['apps']} apps, {c['seconds']} s "
                  f"runs alternated: this build {c['this_us']} µs, {c['baseline']} (no history) "
                  f"{c['baseline_us']} µs (medians of 3; rounds: "
                  + ", ".join(f"{r['build']} {r['cpu_us_per_request']}" for r in c["rounds"]) + ")."]
    lines += ["", "## Targets (issue 23)", ""]
    for r in o["import"]:
        lines.append(f"- {r['apps']} apps imported in under 10 s ({r['store']} store): measured {r['seconds']} s "
                     f"→ **{'met' if r['seconds'] < 10 else 'NOT met'}**")
        lines.append(f"- a bad line refuses the whole file, nothing half-applied ({r['store']}): "
                     f"**{'met' if r['bad_exit'] != 0 and not r['bad_partially_applied'] else 'NOT met'}**")
    if c:
        lines.append(f"- CPU per proxied request with the history ≤ 1.03× without: measured {c['ratio']}× "
                     f"→ **{'met' if c['ratio'] <= 1.03 else 'NOT met'}**")
    lines += earlier_lines(o, lambda r: f"import s {r.get('import_s')}, history {r.get('history_mb')} MB, "
                           f"CPU ratio {r.get('cost_ratio')}")
    return lines


def logd_report(l, date):
    """The log-service section, from bench/bench_logd.py's measurements."""
    rows = l["rows"]
    lines = ["", "# Log service (bench/bench_logd.py)", "",
             f"Measured on {date}. Seed 000's experiment: a sender of 64 KiB packets "
             f"(~{l['lines_per_packet']:.0f} lines of 250 bytes, 50 apps) at each rate for "
             f"{rows[0]['seconds']} s, open loop with at most 256 unacknowledged, into `switchyard logd "
             "--fsync always --rotate-interval-s 20` (every group synced before its acks). Backlog: lines "
             "due by the end of the run and not acknowledged 1 s later. Raw disk: `dd bs=1M count=1024 "
             f"conv=fsync` into the same directory, **{l['disk_mb_s']:.0f} MB/s**.", "",
             "| packets/s | offered MB/s | acknowledged MB/s | vs disk | backlog lines at end | drain s | "
             "lines in files / sent | rotated files |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['rate']} | {r['offered_mb_s']:.1f} | {r['mb_s']:.1f} | "
                     f"{r['mb_s'] / l['disk_mb_s'] * 100:.0f}% | {r['backlog_lines']} | {r['drain_s']:.1f} | "
                     f"{r['lines_in_files']} / {r['lines_sent']} | {r['rotations']} |")
    packet_mb = l["packet_bytes"] / 1e6
    threshold = min(2500, 0.7 * l["disk_mb_s"] / packet_mb)
    tested = [r for r in rows if r["rate"] >= threshold]
    lines += ["", "## Targets (issue 8)", ""]
    if tested:
        r = tested[0]
        met = r["backlog_lines"] == 0
        lines.append(f"- 0 remaining lines at ≥ {threshold:.0f} packets/s (the lower of 2,500/s and 70% of "
                     f"the disk's {l['disk_mb_s']:.0f} MB/s): at {r['rate']}/s measured {r['backlog_lines']} "
                     f"→ **{'met' if met else 'NOT met'}**")
    complete = all(r["lines_in_files"] == r["lines_sent"] for r in rows)
    lines.append(f"- every line sent is in the files at the end of each run: "
                 f"**{'yes' if complete else 'NO'}**")
    return lines


def run_section(key, doc, measure):
    """The life every section script shares: `--seconds`/`--quick`, a work directory,
    `measure(work, seconds, procs)` returning the results (every process it starts goes in
    `procs` and is stopped, newest first, whatever happens), then the results merged under
    `key` into bench/results and the report. Returns the exit status."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=10, help="length of each load run")
    parser.add_argument("--quick", action="store_true", help="3 s runs (smoke test)")
    args = parser.parse_args()
    seconds = 3 if args.quick else args.seconds
    work = Path(tempfile.mkdtemp(prefix=f"switchyard-bench-{key}-"))
    with Started() as procs:
        results = measure(work, seconds, procs)
    return finish_section(key, results, args.quick, work)


def finish_section(key, results, quick, work):
    """Merges a script's results under `key` and removes its work directory (kept when the
    merge failed, to look into). Returns the script's exit status."""
    if not merge_section(key, results, quick):
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0
