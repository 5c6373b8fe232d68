#!/usr/bin/env python3
"""Tenant limits: what they cost on the request path, how exactly they hold, what a million
clients cost, and whether a flooded app's neighbour notices.

One router (2 threads, embedded store, no access log) in front of an nginx origin, all on
127.0.0.1; load from vegeta (constant rate) and wrk (closed loop):

- cost: CPU (utime + stime of the router) per request at 2,000 req/s for 10 s, to an app
  without limits and to one with every limit set and none reached (allow list, sizes, app
  and per-client rates far above the load, max_in_flight); alternating rounds, median of 5;
  target: ≤ 1.05× without;
- accuracy: an app limited to 1,000 req/s (burst 1) offered 2,000 req/s for 10 s: answers
  200 per second (target 1,000 ± 5%) and 429 for the rest;
- memory: an app with a per-client limit by address, the router trusting 127.0.0.1's
  X-Forwarded-For, and wrk sending a new address with every request until 1,000,000
  distinct clients were seen; the router's RSS at each 100,000 (target: flat after the
  first 100,000: the client table holds `--limit-clients` = 100,000 records);
- isolation (median of 5 rounds): a neighbour app at 500 req/s (vegeta, p99) alone, then while another app
  limited to 200 req/s is flooded at 10× its limit (2,000 req/s); target: the neighbour's
  p99 ≤ 1.2× its value without the flood. For scale, also beside the same flood to an app
  without limits. The flood's vegeta shares the router's 2 cores.

Results go to bench/results/latest.json under "limits" and to bench/RESULTS.md.
"""

import json
import subprocess
import sys
import time

import bench as common
import report

EVERY_LIMIT = {
    "allow": ["0.0.0.0/0", "::/0"], "deny": ["192.0.2.0/24"],
    "requests_per_s": 1_000_000, "burst": 1_000_000,
    "per_client": {"key": "client_ip", "requests_per_s": 1_000_000, "burst": 1_000_000},
    "max_in_flight": 100_000, "max_body_bytes": 1 << 20, "max_header_bytes": 16384,
    "max_uri_bytes": 4096,
}


def attack(port, host, rate, seconds, path="/"):
    """vegeta at `rate` for `seconds`: its JSON report."""
    target = f"GET http://127.0.0.1:{port}{path}\nHost: {host}\n"
    out = subprocess.run(
        [common.VEGETA, "attack", f"-rate={rate}", f"-duration={seconds}s", "-timeout=5s",
         "-keepalive=true", "-connections=64", "-workers=64", "-max-workers=64"],
        input=target.encode(), check=True, capture_output=True).stdout
    return json.loads(subprocess.run([common.VEGETA, "report", "-type=json"], input=out,
                                     check=True, capture_output=True).stdout)


def cpu_per_request(proc, port, host, rate, seconds):
    before = common.cpu_seconds(proc.pid)
    result = attack(port, host, rate, seconds)
    answered = max(result["status_codes"].get("200", 0), 1)
    return (common.cpu_seconds(proc.pid) - before) * 1e6 / answered


def cost(proc, port, rounds, seconds):
    samples = {"none": [], "every": []}
    for _ in range(rounds):
        for label, host in (("none", "plain.test"), ("every", "limited.test")):
            samples[label].append(cpu_per_request(proc, port, host, 2000, seconds))
    median = {label: sorted(v)[len(v) // 2] for label, v in samples.items()}
    print(f"cost: {median['none']:.1f} µs/request without limits, {median['every']:.1f} with every limit "
          f"({median['every'] / median['none']:.3f}×); rounds {samples}", flush=True)
    return {"rounds": samples, "us_without": round(median["none"], 1), "us_with": round(median["every"], 1),
            "ratio": round(median["every"] / median["none"], 3)}


def accuracy(port, seconds):
    result = attack(port, "rated.test", 2000, seconds)
    codes = result["status_codes"]
    admitted = codes.get("200", 0) / seconds
    print(f"accuracy: limit 1000/s, offered {result['rate']:.0f}/s: {admitted:.1f}/s admitted, "
          f"codes {codes}", flush=True)
    return {"limit_per_s": 1000, "offered_per_s": round(result["rate"], 1),
            "admitted_per_s": round(admitted, 1), "status_codes": codes,
            "error_pct": round((admitted - 1000) / 10, 2)}


WRK_SCRIPT = """
local counter = 0
local thread_number = 0
function setup(thread)
  thread:set("id", thread_number)
  thread_number = thread_number + 1
end
function request()
  counter = counter + 1
  local address = string.format("%d.%d.%d.%d", 10 + id, math.floor(counter / 65536) % 256,
                                math.floor(counter / 256) % 256, counter % 256)
  return wrk.format(nil, nil, {["Host"] = "clients.test", ["X-Forwarded-For"] = address})
end
"""


def client_memory(work, proc, port, admin_port, clients):
    script = work / "clients.lua"
    script.write_text(WRK_SCRIPT)
    seen = lambda: sum(common.metric(admin_port, f'switchyard_limit_decisions_total{{app="clients",'
                                                f'limit="client_rate",result="{r}"}}') or 0
                       for r in ("allowed", "refused"))
    loader = subprocess.Popen(["wrk", "-t2", "-c32", "-d600s", "-s", str(script),
                               f"http://127.0.0.1:{port}/"], stdout=subprocess.DEVNULL)
    rows, next_mark, started = [], clients // 10, time.monotonic()
    try:
        while next_mark <= clients and time.monotonic() - started < 600:
            count = seen()
            if count >= next_mark:
                rows.append({"clients": int(count), "rss_kib": common.rss_kib(proc.pid),
                             "records": common.metric(admin_port, "switchyard_limit_clients")})
                print(f"memory: {rows[-1]}", flush=True)
                next_mark += clients // 10
            time.sleep(0.2)
    finally:
        loader.terminate()
        loader.wait()
    return rows


def beside_flood(work, port, seconds, flood_host):
    """The neighbour's vegeta report while `flood_host` gets 2,000 req/s, and the flood's.
    The flood's results go to a file: through a pipe read only at the end, vegeta would
    stall once the pipe is full, and the flood with it."""
    results = work / "flood.bin"
    with open(results, "wb") as out:
        flood = subprocess.Popen(
            [common.VEGETA, "attack", "-rate=2000", f"-duration={seconds + 2}s", "-timeout=5s",
             "-keepalive=true", "-connections=64", "-workers=64", "-max-workers=64"],
            stdin=subprocess.PIPE, stdout=out)
        flood.stdin.write(f"GET http://127.0.0.1:{port}/\nHost: {flood_host}\n".encode())
        flood.stdin.close()
        time.sleep(1)
        neighbour = attack(port, "quiet.test", 500, seconds)
        flood.wait()
    flood_report = json.loads(subprocess.run([common.VEGETA, "report", "-type=json"],
                                             input=results.read_bytes(), check=True,
                                             capture_output=True).stdout)
    return neighbour, flood_report


def isolation(work, port, seconds, rounds):
    """Rounds of: the neighbour alone, beside a limited flood, beside an unlimited one; the
    median p99 of each (a single p99 of 5,000 requests on 2 shared cores is noisy)."""
    p99 = lambda report: report["latencies"]["99th"] / 1e6
    alone, limited, unlimited, limited_flood = [], [], [], None
    for _ in range(rounds):
        alone.append(p99(attack(port, "quiet.test", 500, seconds)))
        neighbour, limited_flood = beside_flood(work, port, seconds, "noisy.test")
        limited.append(p99(neighbour))
        unlimited.append(p99(beside_flood(work, port, seconds, "plain.test")[0]))
    median = lambda values: sorted(values)[len(values) // 2]
    a, l, u = median(alone), median(limited), median(unlimited)
    print(f"isolation: neighbour p99 {a:.3f} ms alone, {l:.3f} ms beside a flood limited to 200/s "
          f"({l / a:.2f}×; flood codes {limited_flood['status_codes']}), {u:.3f} ms beside the same "
          f"flood unlimited ({u / a:.2f}×); rounds {alone} {limited} {unlimited}", flush=True)
    return {"neighbour_rate": 500, "flood_rate": 2000, "flood_limit": 200, "rounds": rounds,
            "p99_ms_alone": round(a, 3), "p99_ms_flooded": round(l, 3), "ratio": round(l / a, 2),
            "p99_ms_unlimited_flood": round(u, 3), "ratio_unlimited": round(u / a, 2),
            "p99_rounds_ms": {"alone": alone, "limited": limited, "unlimited": unlimited},
            "flood_status_codes": limited_flood["status_codes"]}


def measure(work, seconds, procs, quick):
    origin, backend, _ = common.start_origin(work)
    procs.append(origin)
    proc, port, admin_port = common.serve_switchyard(
        work, "limits", "--threads", str(common.THREADS), "--waf", "off",
        "--trusted-proxies", "127.0.0.1/32")
    procs.append(proc)
    backends = [f"127.0.0.1:{backend}"]
    apps = {
        "plain": {}, "limited": EVERY_LIMIT, "rated": {"requests_per_s": 1000},
        "clients": {"per_client": {"key": "client_ip", "requests_per_s": 10, "burst": 10}},
        "quiet": {}, "noisy": {"requests_per_s": 200},
    }
    for name, limits in apps.items():
        spec = {"domains": [f"{name}.test"], "backends": backends}
        if limits:
            spec["limits"] = limits
        common.put_app(admin_port, name, spec)
        common.get(port, f"{name}.test")
    results = {
        "cost": cost(proc, port, 1 if quick else 5, seconds),
        "accuracy": accuracy(port, seconds),
        "isolation": isolation(work, port, seconds, 1 if quick else 5),
        "memory": client_memory(work, proc, port, admin_port, 100_000 if quick else 1_000_000),
    }
    return results


def main():
    quick = "--quick" in sys.argv
    return report.run_section("limits", __doc__, lambda work, seconds, procs: measure(work, seconds, procs, quick))


if __name__ == "__main__":
    sys.exit(main())
