#!/usr/bin/env python3
"""What an app's proxy-wasm filter costs (issue 70), in one run on one machine:

- instructions per proxied request (callgrind, one Switchyard thread, instructions.py's
  two-run measure) of the same app three ways: no filter; the header policy as a built-in
  header rule (two answer fields set, one removed); the same policy as the example filter
  examples/filters/header-policy (proxy-wasm Rust SDK) on the wasmtime host;
- CPU per request at a constant rate (vegeta, keep-alive, utime+stime of the router ÷
  requests), the three apps on three routers, alternated rounds;
- a module's start: compiled on upload (a fresh router), and loaded from the disk cache by
  hash (the same router restarted), from switchyard_filter_compile_seconds;
- memory per instance: resident set growth of a one-thread router whose --apps apps each
  run the filter once, less that of the same apps with the built-in rule;
- a module change across a fleet: two routers on one Redis (redis-server on a free port),
  the module put on the first, the time until the second serves it, --changes times.

    python3 bench/engines/filters.py [--requests 2000] [--rate 2000] [--seconds 10]

Needs what bench/run installs (valgrind, vegeta, nginx, redis-server), target/release's
switchyard and the example filters built (scripts/test builds them). Prints a table for
bench/FILTERS.md.
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import run as R  # noqa: E402
import bench  # noqa: E402
import instructions as I  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODULES = ROOT / "examples" / "filters" / "target" / "wasm32-unknown-unknown" / "release"
POLICY = {"set_response": {"x-frame-options": "DENY", "x-policy": "v1"}, "remove_response": ["server"]}
VARIANTS = [
    ("no filter", {}),
    ("built-in header rule", {"headers": {"response": {
        "set": {"X-Frame-Options": "DENY", "X-Policy": "v1"}, "remove": ["Server"]}}}),
    ("header-policy filter", {"filters": [{"name": "policy", "config": POLICY}]}),
]


def admin_call(admin, method, path, body=None, content_type="application/json"):
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{admin}{path}", method=method, data=data,
                                     headers={"Content-Type": content_type})
    with urllib.request.urlopen(request, timeout=120) as answer:
        text = answer.read()
        return json.loads(text) if text else None


def put_module(admin, name, file):
    return admin_call(admin, "PUT", f"/v1/filters/{name}", (MODULES / file).read_bytes(),
                      "application/wasm")


def metric(admin, series):
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(series + " "):
                return float(line.split()[1])
    return 0.0


def start(work, label, wrap=(), threads=2, data=None, extra=()):
    """A router with the policy module stored; its process, HTTP and admin ports."""
    port, admin = bench.free_port(), bench.free_port()
    name = f"{label}-{port}"
    proc = bench.Process(name, [
        *wrap, str(bench.BIN), "serve", "--http", f"127.0.0.1:{port}", "--https", "off",
        "--admin", f"127.0.0.1:{admin}", "--data-dir", str(data or work / f"{name}-data"),
        "--access-log", "off", "--shutdown-grace-s", "0", "--threads", str(threads),
        "--waf", "off", *extra,
    ], work, env={"RUST_LOG": "warn", "PATH": "/usr/bin:/bin"})
    bench.wait_port(port, timeout=180)
    bench.wait_port(admin, timeout=180)
    return proc, port, admin


def app(admin, backend, options, name="app7", host=R.HOST):
    admin_call(admin, "PUT", f"/v1/apps/{name}",
               {"domains": [host], "backends": [f"127.0.0.1:{backend}"], **options})


def instructions(work, backend, args):
    measured = {}
    for label, options in VARIANTS:
        totals = []
        for requests in (0, args.requests):
            out = work / f"{label.replace(' ', '-')}-{requests}.callgrind"
            proc, port, admin = start(work, "callgrind", wrap=I.valgrind("callgrind", out), threads=1)
            try:
                put_module(admin, "policy", "header_policy.wasm")
                app(admin, backend, options)
                I.prime(port, "http")
                answered = I.load(port, "http", I.FIRST_REQUESTS, args.callgrind_rate)
                if requests:
                    answered += I.load(port, "http", requests, args.callgrind_rate)
            finally:
                proc.stop()
            time.sleep(0.5)
            totals.append((answered, I.total("callgrind", out, None)[0]))
        (few, few_total), (many, many_total) = totals
        measured[label] = (many_total - few_total) / max(many - few, 1)
        print(f"{label}: {measured[label]:,.0f} instructions per request", flush=True)
    return measured


def cpu(work, backend, args):
    routers = []
    for label, options in VARIANTS:
        proc, port, admin = start(work, label.replace(" ", "-"))
        put_module(admin, "policy", "header_policy.wasm")
        app(admin, backend, options)
        status, _ = bench.get(port, R.HOST)
        assert status == 200, f"{label}: {status}"
        routers.append((label, port, proc))
    try:
        runs = bench.cpu_per_request(routers, lambda port: f"GET http://127.0.0.1:{port}/\nHost: {R.HOST}\n",
                                     args.rate, args.seconds, args.rounds, "cpu")
    finally:
        for _, _, proc in routers:
            proc.stop()
    return {label: statistics.median(r["cpu_ms"] for r in runs[label]) * 1000 for label in runs}


def startup(work, backend):
    data = work / "startup-data"
    proc, port, admin = start(work, "startup", data=data)
    try:
        began = time.monotonic()
        put_module(admin, "policy", "header_policy.wasm")
        app(admin, backend, VARIANTS[2][1])
        bench.get(port, R.HOST)
        first = time.monotonic() - began
        compiled = metric(admin, "switchyard_filter_compile_seconds_sum")
    finally:
        proc.stop()
    proc, port, admin = start(work, "startup-again", data=data)
    try:
        began = time.monotonic()
        status, _ = bench.get(port, R.HOST)
        again = time.monotonic() - began
        cached = metric(admin, "switchyard_filter_compile_seconds_sum")
        assert status == 200, status
    finally:
        proc.stop()
    # The upload compiles once to check the module and once more to load it: half each.
    return {"compile_ms": compiled / 2 * 1e3, "upload_to_first_answer_ms": first * 1e3,
            "from_disk_cache_ms": cached * 1e3, "restart_first_answer_ms": again * 1e3}


def memory(work, backend, apps):
    grown = {}
    for label, options in VARIANTS[1:]:
        proc, port, admin = start(work, f"memory-{label.replace(' ', '-')}", threads=1)
        try:
            put_module(admin, "policy", "header_policy.wasm")
            for i in range(apps):
                app(admin, backend, options, name=f"m{i}", host=f"m{i}.bench")
            bench.get(port, "m0.bench")
            time.sleep(1)
            before = bench.rss_kib(proc.pid)
            for i in range(apps):
                status, _ = bench.get(port, f"m{i}.bench")
                assert status == 200, status
            time.sleep(1)
            grown[label] = bench.rss_kib(proc.pid) - before
            if "filter" in label:
                grown["instances"] = metric(admin, "switchyard_filter_instances")
        finally:
            proc.stop()
    # The rule's apps beside them: what the routes alone grow by (the allocator may give
    # memory back meanwhile: a negative growth). Per instance: the filter's apps' growth,
    # routes included, over the instances: an upper bound.
    per_instance = grown["header-policy filter"] / max(grown["instances"], 1)
    return {"apps": apps, "instances": grown["instances"], "kib_per_instance": per_instance,
            "rss_growth_filter_kib": grown["header-policy filter"], "rss_growth_rule_kib": grown["built-in header rule"]}


def fleet(work, backend, changes):
    if not shutil.which("redis-server"):
        return None
    redis_port = bench.free_port()
    redis = bench.Process("redis", ["redis-server", "--port", str(redis_port), "--save", "",
                                    "--appendonly", "no", "--dir", str(work)], work)
    bench.wait_port(redis_port)
    store = ["--store", f"redis://127.0.0.1:{redis_port}"]
    first = start(work, "fleet-a", extra=store)
    second = start(work, "fleet-b", extra=store)
    took = []
    try:
        put_module(first[2], "policy", "header_policy.wasm")
        app(first[2], backend, VARIANTS[2][1])
        files = ["misbehave.wasm", "header_policy.wasm"]
        for i in range(changes):
            file = files[i % 2]
            wants_policy = file == "header_policy.wasm"
            began = time.monotonic()
            put_module(first[2], "policy", file)
            while time.monotonic() - began < 10:
                conn = __import__("http.client").client.HTTPConnection("127.0.0.1", second[1], timeout=5)
                conn.request("GET", "/", headers={"Host": R.HOST})
                answer = conn.getresponse()
                answer.read()
                conn.close()
                if (answer.getheader("x-policy") == "v1") == wants_policy:
                    break
                time.sleep(0.002)
            took.append((time.monotonic() - began) * 1e3)
    finally:
        for proc in (second[0], first[0], redis):
            proc.stop()
    return {"changes": changes, "median_ms": statistics.median(took), "max_ms": max(took)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--callgrind-rate", type=int, default=200)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--apps", type=int, default=200)
    parser.add_argument("--changes", type=int, default=10)
    parser.add_argument("--skip", action="append", default=[],
                        help="instructions, cpu, startup, memory or fleet (repeatable)")
    args = parser.parse_args()
    for module in ("header_policy.wasm", "misbehave.wasm"):
        if not (MODULES / module).exists():
            sys.exit(f"{MODULES / module} missing: build examples/filters (scripts/test does)")
    work = Path(tempfile.mkdtemp(prefix="filters-bench-"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    print(f"commit {commit}, {bench.machine() if hasattr(bench, 'machine') else ''}")
    results = {}
    with bench.Started() as processes:
        origin, backend, _ = R.start_origin(work)
        processes.append(origin)
        if "instructions" not in args.skip:
            results["instructions"] = instructions(work, backend, args)
        if "cpu" not in args.skip:
            results["cpu_us"] = cpu(work, backend, args)
        if "startup" not in args.skip:
            results["startup"] = startup(work, backend)
        if "memory" not in args.skip:
            results["memory"] = memory(work, backend, args.apps)
        if "fleet" not in args.skip:
            results["fleet"] = fleet(work, backend, args.changes)
    print(json.dumps(results, indent=2))
    ins, cpu_us = results.get("instructions", {}), results.get("cpu_us", {})
    if ins or cpu_us:
        print("\n| app | instructions / request | CPU µs / request |\n|---|---|---|")
        for label, _ in VARIANTS:
            i, c = ins.get(label), cpu_us.get(label)
            print(f"| {label} | {f'{i:,.0f}' if i else '–'} | {f'{c:.1f}' if c else '–'} |")


if __name__ == "__main__":
    main()
