#!/usr/bin/env python3
"""The operator's tools at scale (issue 23): the bulk import and the traffic history.

Import: `switchyard apps import FILE` with 20,000 apps (JSON lines, one domain and one
backend each) into a fresh router, on the embedded store and on Redis; wall time of the
command (target: under 10 s), then one app's host is asked for to check the import routes.
A second file with one bad line is refused whole: the time to refuse and that no app of it
was applied.

History: 100,000 apps imported, 10,000 of them asked for once each, then the history's
memory as the router reports it (`GET /v1/stats/apps`, `switchyard_history_bytes`) after
its next sample, and the router's RSS.

Cost: CPU per proxied request (utime+stime of the router ÷ requests) at 2,000 req/s
over 100 apps' hosts, this build against `SWITCHYARD_BASELINE_BIN` (a build from before
the history, named by `SWITCHYARD_BASELINE_COMMIT`), alternated, three rounds each
(target: at most 3% more).

Results go to bench/results/latest.json under "operator" and to bench/RESULTS.md.
"""

import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

import bench as common
import report

IMPORT_APPS = 20_000
HISTORY_APPS = 100_000
ACTIVE_APPS = 10_000
COST_APPS = 100
COST_RATE = 2000


def app_lines(count, backend_port, prefix):
    return "\n".join(json.dumps({
        "name": f"{prefix}-{i}", "domains": [f"{prefix}-{i}.bench"],
        "backends": [f"127.0.0.1:{backend_port}"]})
        for i in range(count)) + "\n"


def cli_import(admin_port, path):
    started = time.monotonic()
    out = subprocess.run([str(common.BIN), "apps", "import", str(path), "--admin", f"127.0.0.1:{admin_port}"],
                         capture_output=True, text=True)
    return time.monotonic() - started, out


def stats(admin_port):
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/v1/stats/apps?limit=1", timeout=10) as r:
        return json.loads(r.read())


def import_run(work, procs, label, backend_port, extra):
    sy, http_port, admin_port = common.serve_switchyard(work, f"import-{label}", *extra)
    procs.append(sy)
    good = work / f"good-{label}.jsonl"
    good.write_text(app_lines(IMPORT_APPS, backend_port, f"{label}"))
    seconds, out = cli_import(admin_port, good)
    if out.returncode != 0:
        raise SystemExit(f"import on {label} failed: {out.stderr}")
    status, _ = common.get(http_port, f"{label}-{IMPORT_APPS - 1}.bench", "/")
    bad_lines = app_lines(IMPORT_APPS, backend_port, f"{label}-bad").splitlines()
    bad_lines[IMPORT_APPS // 2] = '{"name": "broken", "domains": ["bad..bench"]}'
    bad = work / f"bad-{label}.jsonl"
    bad.write_text("\n".join(bad_lines) + "\n")
    refused_s, refused = cli_import(admin_port, bad)
    applied_of_bad = common.get(http_port, f"{label}-bad-0.bench", "/")[0] != 404
    sy.stop()
    row = {"store": label, "apps": IMPORT_APPS, "seconds": round(seconds, 2), "routed_after": status,
           "summary": out.stdout.strip().splitlines()[-1], "bad_refused_s": round(refused_s, 2),
           "bad_exit": refused.returncode, "bad_message": refused.stderr.strip().splitlines()[-1],
           "bad_partially_applied": applied_of_bad}
    print(f"{label}: {IMPORT_APPS} apps imported in {seconds:.2f} s ({row['summary']}); host answers {status}; "
          f"a file with a bad line refused in {refused_s:.2f} s, exit {refused.returncode}, "
          f"applied anyway: {applied_of_bad}", flush=True)
    return row


def history_run(work, procs, backend_port):
    sy, http_port, admin_port = common.serve_switchyard(work, "history", "--route-cache-apps", "200000")
    procs.append(sy)
    path = work / "history.jsonl"
    path.write_text(app_lines(HISTORY_APPS, backend_port, "h"))
    seconds, out = cli_import(admin_port, path)
    if out.returncode != 0:
        raise SystemExit(f"import of {HISTORY_APPS} apps failed: {out.stderr}")
    before = common.rss_kib(sy.pid)
    for i in range(ACTIVE_APPS):
        status, _ = common.get(http_port, f"h-{i}.bench", "/")
        if status != 200:
            raise SystemExit(f"h-{i}.bench answered {status}")
    # Two samples (10 s apart) after the traffic: every active app is in the history.
    deadline = time.monotonic() + 30
    shown = stats(admin_port)
    while shown["tracked_apps"] < ACTIVE_APPS and time.monotonic() < deadline:
        time.sleep(1)
        shown = stats(admin_port)
    after = common.rss_kib(sy.pid)
    sy.stop()
    row = {"apps": HISTORY_APPS, "active": ACTIVE_APPS, "import_s": round(seconds, 2),
           "tracked_apps": shown["tracked_apps"], "history_bytes": shown["memory_bytes"],
           "rss_before_traffic_kib": before, "rss_after_kib": after}
    print(f"history: {HISTORY_APPS} apps ({seconds:.1f} s to import), {ACTIVE_APPS} active: "
          f"{shown['tracked_apps']} tracked, {shown['memory_bytes'] / 1e6:.1f} MB; RSS just after the import "
          f"{before / 1024:.0f} MiB, at the end {after / 1024:.0f} MiB", flush=True)
    return row


def cost_run(work, procs, backend_port, binary, tag, seconds):
    """CPU per proxied request of one build at a constant rate over COST_APPS hosts (so the
    history, where there is one, keeps COST_APPS apps and samples them every 10 s)."""
    sy, http_port, admin_port = common.serve_switchyard(work, f"cost-{tag}", binary=binary)
    procs.append(sy)
    for i in range(COST_APPS):
        common.put_app(admin_port, f"cost-{i}", {"domains": [f"cost-{i}.bench"],
                                                 "backends": [f"127.0.0.1:{backend_port}"]})
    targets = "".join(f"GET http://127.0.0.1:{http_port}/\nHost: cost-{i}.bench\n\n" for i in range(COST_APPS))

    def attack(rate, duration):
        return subprocess.run([common.VEGETA, "attack", f"-rate={rate}", f"-duration={duration}s",
                               "-timeout=5s", "-keepalive=true"], input=targets.encode(), check=True,
                              capture_output=True).stdout

    attack(500, 2)  # routes built, connections pooled
    before = common.cpu_seconds(sy.pid)
    summary = common.vegeta_summary(attack(COST_RATE, seconds))
    used = common.cpu_seconds(sy.pid) - before
    sy.stop()
    return {"tag": tag, "requests": summary["requests"], "success": summary["success"],
            "cpu_us_per_request": round(used / summary["requests"] * 1e6, 2), "p99_ms": round(summary["p99_ms"], 3)}


def cost(work, procs, backend_port, seconds):
    """The history's cost: this build against SWITCHYARD_BASELINE_BIN (a build without the
    history), alternated over three rounds; the median of each."""
    baseline = os.environ.get("SWITCHYARD_BASELINE_BIN")
    if not baseline:
        print("cost: no SWITCHYARD_BASELINE_BIN, skipped", flush=True)
        return None
    label = os.environ.get("SWITCHYARD_BASELINE_COMMIT", "baseline")
    rounds = []
    for n in range(3):
        for binary, tag in ((None, "this"), (baseline, label)):
            row = cost_run(work, procs, backend_port, binary, f"{tag}-{n}", seconds)
            row["build"] = tag
            rounds.append(row)
            print(f"cost {tag} round {n + 1}: {row['cpu_us_per_request']} µs CPU per request "
                  f"({row['requests']} requests, success {row['success']:.4f}, p99 {row['p99_ms']} ms)", flush=True)
    median = lambda tag: statistics.median(r["cpu_us_per_request"] for r in rounds if r["build"] == tag)
    return {"baseline": label, "rate": COST_RATE, "apps": COST_APPS, "seconds": seconds, "rounds": rounds,
            "this_us": median("this"), "baseline_us": median(label),
            "ratio": round(median("this") / median(label), 3)}


def summary(section):
    return {"import_s": {r["store"]: r["seconds"] for r in section["import"]},
            "history_mb": round(section["history"]["history_bytes"] / 1e6, 1),
            "cost_ratio": (section.get("cost") or {}).get("ratio")}


def measure(work, seconds, procs):
    earlier = common.earlier_summary("operator", summary)
    backend_port = common.free_port()
    origin = common.start_nginx_origin(work, "origin", f"""
    server {{ listen 127.0.0.1:{backend_port}; location / {{ return 200 "ok\\n"; }} }}""", [backend_port])
    procs.append(origin)
    redis_port = common.free_port()
    redis = common.Process("redis", ["redis-server", "--bind", "127.0.0.1", "--port", str(redis_port),
                                     "--save", "", "--appendonly", "no", "--dir", str(work)], work)
    procs.append(redis)
    common.wait_port(redis_port)
    rows = [import_run(work, procs, "embedded", backend_port, []),
            import_run(work, procs, "redis", backend_port, ["--store", f"redis://127.0.0.1:{redis_port}/0"])]
    return {"import": rows, "history": history_run(work, procs, backend_port),
            "cost": cost(work, procs, backend_port, max(seconds, 20)), "earlier_runs": earlier}


def main():
    return report.run_section("operator", __doc__, measure)


if __name__ == "__main__":
    sys.exit(main())
