#!/usr/bin/env python3
"""The HTTP benchmark: Switchyard, nginx and HAProxy side by side on this machine.

Every proxy gets the same apps (app{i}.bench, one upstream each), the same backends (a
separate nginx answering "b1"/"b2"), two worker threads, and no access log. Results go to
bench/RESULTS.md and bench/results/latest.json. Everything listens on 127.0.0.1 only and
every process started here is stopped by PID at the end.

Measurements
- closed-loop max throughput: wrk, 2 threads, 64 connections, one Host;
- constant-rate latency: vegeta at 500/1000/2000 req/s. vegeta is open-loop (it sends on
  schedule whatever the previous answers did), so its percentiles are free of coordinated
  omission;
- route change: time from the start of a change (Switchyard: the admin PUT; nginx: rewriting
  the app's file + SIGHUP) until a new connection is answered by the new backend;
- memory: Switchyard's resident set at 100,000 stored apps, idle and after every app was
  requested once (all routes cached).
"""

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import report
from bench import (
    HOT_HOST, ROOT, Started, cached_app_memory, get, machine, nginx_route_changes, start_haproxy,
    start_nginx, start_origin, start_switchyard, switchyard_route_changes, vegeta_latency,
    wrk_throughput,
)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=10, help="length of each load run")
    parser.add_argument("--quick", action="store_true", help="short runs, small app counts (smoke test)")
    args = parser.parse_args()
    seconds = 3 if args.quick else args.seconds
    load_apps = 100 if args.quick else 1000
    change_sizes = [1000] if args.quick else [1000, 10000, 100000]
    nginx_sizes = [1000] if args.quick else [1000, 10000]
    memory_apps = 10000 if args.quick else 100000
    rates = [500, 1000, 2000]

    work = Path(tempfile.mkdtemp(prefix="switchyard-bench-"))
    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
               "apps_for_load": load_apps, "throughput": {}, "latency": {}, "route_change": [],
               "nginx_start": {}, "targets": []}
    with Started() as started:
        origin, b1, b2 = start_origin(work)
        started.append(origin)
        print(f"work dir {work}; backends b1={b1} b2={b2}", flush=True)

        # Throughput and latency: the three proxies over the same apps, one at a time.
        sy, sy_port, sy_admin = start_switchyard(work, load_apps, b1, "load")
        ng, ng_port, _, _ = start_nginx(work, load_apps, b1)
        ha, ha_port = start_haproxy(work, load_apps, b1)
        started += [sy, ng, ha]
        proxies = {"switchyard": sy_port, "nginx": ng_port, "haproxy": ha_port}
        for name, port in proxies.items():
            status, body = get(port, HOT_HOST)
            assert status == 200 and body.strip() == b"b1", (name, status, body)
        for name, port in proxies.items():
            wrk_throughput(port, 2)  # warm-up
            rps, errors = wrk_throughput(port, seconds)
            results["throughput"][name] = {"rps": rps, "errors": errors}
            print(f"throughput {name}: {rps:.0f} req/s {errors}", flush=True)
        for name, port in proxies.items():
            results["latency"][name] = []
            for rate in rates:
                r = vegeta_latency(port, rate, seconds)
                results["latency"][name].append(r)
                print(f"latency {name} @{rate}: p50 {r['p50_ms']:.3f} p99 {r['p99_ms']:.3f} ms", flush=True)
        for p in (sy, ng, ha):
            p.stop()
            started.remove(p)

        # Route changes.
        for apps in change_sizes:
            sy, sy_port, sy_admin = start_switchyard(work, apps, b1, f"change-{apps}")
            started.append(sy)
            r = switchyard_route_changes(sy_port, sy_admin, apps, b1, b2, 50)
            results["route_change"].append({"proxy": "switchyard", "apps": apps, **r})
            print(f"route change switchyard {apps}: p50 {r['p50_ms']:.2f} p99 {r['p99_ms']:.2f} ms", flush=True)
            sy.stop()
            started.remove(sy)
        for apps in nginx_sizes:
            ng, ng_port, _, start_s = start_nginx(work, apps, b1)
            started.append(ng)
            results["nginx_start"][apps] = start_s
            r = nginx_route_changes(ng, ng_port, work, apps, b1, b2, 10 if apps >= 10000 else 20)
            results["route_change"].append({"proxy": "nginx", "apps": apps, **r})
            print(f"route change nginx {apps}: p50 {r['p50_ms']:.2f} p99 {r['p99_ms']:.2f} ms", flush=True)
            ng.stop()
            started.remove(ng)

        # Memory per stored app.
        results["memory"] = cached_app_memory(work, memory_apps, b1, started)
        m = results["memory"]
        print(f"memory: empty {m['rss_empty_kib']} KiB, idle {m['rss_idle_kib']} KiB, "
              f"touched {m['rss_touched_kib']} KiB, cached {m['apps_cached']}", flush=True)

        # Targets of issue 2, from the figures above.
        ratio = results["throughput"]["switchyard"]["rps"] / results["throughput"]["nginx"]["rps"]
        results["targets"].append({"name": "throughput ≥ 1.2× nginx", "measured": f"{ratio:.2f}×", "met": ratio >= 1.2})
        by_size = {r["apps"]: r for r in results["route_change"] if r["proxy"] == "switchyard"}
        biggest = by_size[max(by_size)]
        results["targets"].append({"name": f"route change p99 < 10 ms at {max(by_size)} apps",
                                   "measured": f"{biggest['p99_ms']:.2f} ms", "met": biggest["p99_ms"] < 10})
        if 1000 in by_size and max(by_size) > 1000:
            growth = biggest["p99_ms"] / by_size[1000]["p99_ms"]
            results["targets"].append({"name": f"route change p99 at {max(by_size)} apps ≤ 2× the 1000-app figure",
                                       "measured": f"{growth:.2f}×", "met": growth <= 2})
        per_app = results["memory"]["bytes_per_app"]
        results["targets"].append({"name": f"resident memory ≤ 2 KB per stored app at {memory_apps} apps (all cached)",
                                   "measured": f"{per_app:.0f} B", "met": per_app <= 2048})

    out = ROOT / "bench" / ("RESULTS-quick.md" if args.quick else "RESULTS.md")
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    latest = ROOT / "bench" / "results" / ("quick.json" if args.quick else "latest.json")
    # The other scripts' sections (https, fleet, mirror, cache, waf) stay as they were measured.
    if latest.exists():
        earlier = json.loads(latest.read_text())
        results = {**{k: v for k, v in earlier.items() if k not in results}, **results}
    report.write_report(results, out)
    latest.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
