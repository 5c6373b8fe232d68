#!/usr/bin/env python3
"""What the per-app switches cost: CPU per request of Switchyard proxying to the same origin
for an app with no switch (this build beside an earlier one, SWITCHYARD_BEFORE_BIN labelled
SWITCHYARD_BEFORE_LABEL), and for apps with one switch each on this build, in one run on one
machine.

    python3 bench/switches.py [--seconds 10] [--rounds 5]

CPU per request at a constant 2,000 req/s (vegeta over keep-alive; utime + stime of the
router's process ÷ requests), every front alternated `rounds` times, median. Fronts:
- plain: no switch (the app every other app is compared with; and the earlier build);
- headers: three request and three answer header rules;
- affinity: sticky sessions, every request with the cookie of its backend;
- auth: a password (bcrypt cost 5), every request with credentials that passed
  before (the remembered-credentials path);
- redirect: a host redirect answered by the router (no backend);
- bcrypt: the cost of one password check (cost 5) on the worker pool — 99 users, each
  asking once with credentials not remembered yet, CPU of the whole router ÷ 99 checks.
Writes the "Per-app switches" section of bench/RESULTS.md, earlier runs kept below.
"""

import argparse
import base64
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bcrypt

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402
import cache_hits  # noqa: E402

RATE = 2000
TITLE = "## Per-app switches (bench/switches.py)"
RESULTS = bench.ROOT / "bench" / "RESULTS.md"
CHECKS = 99

def basic(user, password):
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def apps(origin_port):
    backend = [f"127.0.0.1:{origin_port}"]
    hashed = bcrypt.hashpw(b"bench", bcrypt.gensalt(5)).decode().replace("$2b$", "$2y$", 1)
    users = {f"u{i}": bcrypt.hashpw(f"p{i}".encode(), bcrypt.gensalt(5)).decode() for i in range(CHECKS)}
    users["bench"] = hashed
    return {
        "plain": {"domains": ["plain.bench"], "backends": backend},
        "headers": {"domains": ["headers.bench"], "backends": backend, "headers": {
            "request": {"set": {"X-Tenant": "bench", "X-Region": "eu"}, "remove": ["X-Debug"]},
            "response": {"set": {"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff"},
                         "remove": ["Server"]}}},
        "affinity": {"domains": ["affinity.bench"], "backends": backend, "affinity": {"cookie": "sticky"}},
        "auth": {"domains": ["auth.bench"], "backends": backend,
                       "basic_auth": {"realm": "bench", "users": users}},
        "redirect": {"domains": ["redirect.bench", "www.redirect.bench"], "backends": backend,
                     "redirects": [{"host": "www.redirect.bench", "to": "https://redirect.bench"}]},
    }


def sticky_cookie(port):
    conn = __import__("http.client").client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/", headers={"Host": "affinity.bench"})
    response = conn.getresponse()
    response.read()
    cookie = response.getheader("Set-Cookie")
    assert cookie, "no affinity cookie"
    return cookie.split(";")[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="switches-"))
    before = os.environ.get("SWITCHYARD_BEFORE_BIN")
    label_now = f"Switchyard at {cache_hits.commit()}"
    label_before = os.environ.get("SWITCHYARD_BEFORE_LABEL", f"Switchyard ({before})")
    with bench.Started() as procs:
        origin, origin_port = bench.start_answer_origin(work, "origin", b"ok", ["Content-Type: text/plain"])
        procs.append(origin)
        specs = apps(origin_port)
        routers = {}
        for name, binary in [("now", bench.BIN)] + ([("before", Path(before))] if before else []):
            proc, port, admin = bench.serve_switchyard(work, f"switchyard-{name}", "--threads",
                                                       str(bench.THREADS), binary=binary)
            procs.append(proc)
            for app, spec in specs.items():
                if name == "now" or app == "plain":
                    bench.put_app(admin, app, spec)
            routers[name] = (proc, port)
        proc, port = routers["now"]
        time.sleep(1)
        headers = {
            "plain": "Host: plain.bench\n",
            "headers": "Host: headers.bench\nX-Debug: 1\n",
            "affinity": f"Host: affinity.bench\nCookie: {sticky_cookie(port)}\n",
            "auth": f"Host: auth.bench\nAuthorization: {basic('bench', 'bench')}\n",
            "redirect": "Host: www.redirect.bench\n",
        }
        fronts = [(f"{app}", (port, app), proc) for app in headers]
        if before:
            fronts.insert(1, ("plain (before)", (routers["before"][1], "plain"), routers["before"][0]))
        for _, (p, app), _ in fronts:
            status, _ = bench.get(p, headers[app].split("\n")[0].split(": ")[1])
            assert status in (200, 301, 401), f"{app}: {status}"
        target = lambda key: f"GET http://127.0.0.1:{key[0]}/\n{headers[key[1]]}"
        cpu = bench.cpu_per_request(fronts, target, RATE, args.seconds, args.rounds, "switch")
        # One bcrypt check per request: each user once, never remembered before.
        bench.wait_for_quiet()
        started = bench.tree_cpu_seconds(proc.pid)
        for i in range(CHECKS):
            conn = __import__("http.client").client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/", headers={"Host": "auth.bench", "Authorization": basic(f"u{i}", f"p{i}")})
            response = conn.getresponse()
            response.read()
            assert response.status == 200, response.status
            conn.close()
        check_ms = (bench.tree_cpu_seconds(proc.pid) - started) / CHECKS * 1e3
        print(f"bcrypt cost 5: {check_ms:.2f} ms CPU per check", flush=True)
    median = {n: statistics.median(r["cpu_ms"] for r in runs) * 1000 for n, runs in cpu.items()}
    base = median["plain"]
    lines = [
        TITLE,
        "",
        f"{bench.measured_on()}; {label_now}. CPU per request at {RATE} req/s (vegeta over keep-alive, "
        f"{args.rounds} alternated runs of {args.seconds} s, median) to a 2-byte origin answer.",
        "",
        "| front | CPU per request (µs) | vs plain | runs (µs) |",
        "|---|---|---|---|",
    ]
    for name in cpu:
        label = name.replace("plain (before)", f"plain, {label_before}")
        runs = ", ".join(f"{r['cpu_ms'] * 1000:.1f}" for r in cpu[name])
        lines.append(f"| {label} | {median[name]:.1f} | {median[name] / base:.3f}× | {runs} |")
    lines.append(f"| one bcrypt check (cost 5, not remembered) | {check_ms * 1000:.0f} | "
                 f"{check_ms * 1000 / base:.0f}× | {CHECKS} checks |")
    print("\n".join(lines))
    cache_hits.RESULTS = RESULTS
    cache_hits.TITLE = TITLE
    cache_hits.replace_section(lines)


if __name__ == "__main__":
    main()
