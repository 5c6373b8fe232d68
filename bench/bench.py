#!/usr/bin/env python3
"""Side-by-side benchmark of Switchyard, nginx and HAProxy on this machine.

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
import http.client
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "release" / "switchyard"
VEGETA = shutil.which("vegeta") or str(Path.home() / "go" / "bin" / "vegeta")
THREADS = 2
HOT_HOST = "app7.bench"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port} after {timeout}s")


class Process:
    """A child process stopped by its own PID."""

    def __init__(self, name, args, log_dir, **kwargs):
        self.name = name
        self.log = open(log_dir / f"{name}.log", "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, **kwargs)

    @property
    def pid(self):
        return self.proc.pid

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def get(port, host, path="/"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


# ---------------------------------------------------------------- peers' configurations

def nginx_origin_conf(work, name, servers, worker_connections=8192, main=""):
    """An nginx playing the app: one worker in the foreground, its pid and error log in `work`
    under `name`, no access log, long keep-alive; `servers` goes in its http block, `main`
    (module loads) before everything."""
    return f"""{main}
worker_processes 1;
daemon off;
pid {work}/{name}.pid;
error_log {work}/{name}-error.log;
events {{ worker_connections {worker_connections}; }}
http {{
    access_log off;
    keepalive_requests 1000000;
{servers}
}}
"""


def start_nginx_origin(work, name, servers, ports, **conf):
    """Starts `nginx_origin_conf(work, name, servers, **conf)` and waits for each of `ports`."""
    path = work / f"{name}.conf"
    path.write_text(nginx_origin_conf(work, name, servers, **conf))
    proc = Process(name, ["nginx", "-c", str(path), "-p", str(work)], work)
    for port in ports:
        wait_port(port)
    return proc


def nginx_app_conf(i, port, backend):
    # One server block and one upstream per app: the "Legacy" set-up of seed 000.
    return f"""upstream app{i} {{ server 127.0.0.1:{backend}; keepalive 16; }}
server {{
    listen 127.0.0.1:{port};
    server_name app{i}.bench;
    location / {{
        proxy_pass http://app{i};
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $host;
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        proxy_set_header X-Forwarded-Proto $scheme;
    }}
}}
"""


def nginx_conf(work, port):
    return f"""
worker_processes {THREADS};
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    server_names_hash_max_size 1048576;
    server_names_hash_bucket_size 128;
    server {{ listen 127.0.0.1:{port} default_server; return 404; }}
    include {work}/nginx-apps/*.conf;
}}
"""


def haproxy_conf(work, port, apps, backend):
    lines = [
        "global",
        f"    nbthread {THREADS}",
        "    maxconn 8000",
        "defaults",
        "    mode http",
        "    timeout connect 3s",
        "    timeout client 60s",
        "    timeout server 60s",
        "    option http-keep-alive",
        "frontend web",
        f"    bind 127.0.0.1:{port}",
        "    http-request set-header X-Forwarded-Proto http",
        "    option forwardfor",
        f"    use_backend %[req.hdr(host),lower,word(1,:),map({work}/hosts.map,notfound)]",
        "backend notfound",
        "    http-request deny deny_status 404",
    ]
    for i in range(apps):
        lines += [f"backend app{i}", "    http-reuse always", f"    server s1 127.0.0.1:{backend}"]
    (work / "hosts.map").write_text("".join(f"app{i}.bench app{i}\n" for i in range(apps)))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- starting the proxies

def start_origin(work):
    b1, b2 = free_port(), free_port()
    proc = start_nginx_origin(work, "origin", f"""
    server {{ listen 127.0.0.1:{b1}; location / {{ return 200 "b1\\n"; }} }}
    server {{ listen 127.0.0.1:{b2}; location / {{ return 200 "b2\\n"; }} }}""",
                              [b1, b2], worker_connections=4096)
    return proc, b1, b2


def start_switchyard(work, apps, backend, tag):
    data = work / f"switchyard-data-{tag}"
    shutil.rmtree(data, ignore_errors=True)
    subprocess.run([str(BIN), "bench-seed", "--data-dir", str(data), "--apps", str(apps),
                    "--backend", f"127.0.0.1:{backend}"], check=True, stdout=subprocess.DEVNULL)
    http_port, admin_port = free_port(), free_port()
    proc = Process(f"switchyard-{tag}", [
        str(BIN), "serve", "--http", f"127.0.0.1:{http_port}", "--admin", f"127.0.0.1:{admin_port}",
        "--data-dir", str(data), "--threads", str(THREADS), "--access-log", "off",
        "--shutdown-grace-s", "0",
    ], work, env={**os.environ, "RUST_LOG": "warn"})
    wait_port(http_port)
    wait_port(admin_port)
    return proc, http_port, admin_port


def serve_switchyard(work, name, *args, log_level="warn"):
    """`switchyard serve` on free ports with its own data directory, no HTTPS listener (it
    would take the default port 8443), no access log and no shutdown grace, plus `args`;
    returns (process, http port, admin port)."""
    http_port, admin_port = free_port(), free_port()
    proc = Process(name, [
        str(BIN), "serve", "--http", f"127.0.0.1:{http_port}", "--https", "off",
        "--admin", f"127.0.0.1:{admin_port}",
        "--data-dir", str(work / f"{name}-data"), "--access-log", "off", "--shutdown-grace-s", "0",
        *args,
    ], work, env={**os.environ, "RUST_LOG": log_level})
    wait_port(http_port)
    wait_port(admin_port)
    return proc, http_port, admin_port


def put_app(admin_port, name, spec, token=None):
    """PUT /v1/apps/{name}; raises unless the admin API answers 200."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"http://127.0.0.1:{admin_port}/v1/apps/{name}", method="PUT",
                                     data=json.dumps(spec).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        if response.status != 200:
            raise RuntimeError(f"PUT /v1/apps/{name} answered {response.status}")


def start_nginx(work, apps, backend):
    port = free_port()
    apps_dir = work / "nginx-apps"
    shutil.rmtree(apps_dir, ignore_errors=True)
    apps_dir.mkdir()
    for i in range(apps):
        (apps_dir / f"app{i}.conf").write_text(nginx_app_conf(i, port, backend))
    conf = work / "nginx.conf"
    conf.write_text(nginx_conf(work, port))
    started = time.time()
    proc = Process(f"nginx-{apps}", ["nginx", "-c", str(conf), "-p", str(work)], work)
    wait_port(port, timeout=300)
    return proc, port, conf, time.time() - started


def start_haproxy(work, apps, backend):
    port = free_port()
    conf = work / "haproxy.cfg"
    conf.write_text(haproxy_conf(work, port, apps, backend))
    proc = Process("haproxy", ["haproxy", "-f", str(conf), "-db"], work)
    wait_port(port)
    return proc, port


# ---------------------------------------------------------------- measurements

def wrk_throughput(port, seconds, host=HOT_HOST, path="/", connections=64):
    out = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "-H", f"Host: {host}",
         f"http://127.0.0.1:{port}{path}"],
        check=True, capture_output=True, text=True).stdout
    return parse_wrk(out)


def parse_wrk(out):
    """Requests per second and error lines of a wrk run's output."""
    rps = float(next(l for l in out.splitlines() if l.startswith("Requests/sec:")).split()[1])
    errors = [l.strip() for l in out.splitlines() if "Non-2xx" in l or "Socket errors" in l]
    return rps, errors


def wrk_latency_ms(out):
    """p50 and p99 (ms) of the distribution `wrk --latency` prints: time to the whole answer,
    which for the small answers measured here is time to first byte plus one read."""
    units = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in ("50%", "99%"):
            value = parts[1]
            unit = next(u for u in ("us", "ms", "s") if value.endswith(u))
            found[parts[0]] = float(value[:-len(unit)]) * units[unit]
    return found.get("50%"), found.get("99%")


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
    procs = []
    try:
        results = measure(work, seconds, procs)
    finally:
        for p in reversed(procs):
            p.stop()
    if not merge_section(key, results, args.quick):
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0


def vegeta_latency(port, rate, seconds):
    target = f"GET http://127.0.0.1:{port}/\nHost: {HOT_HOST}\n"
    attack = subprocess.run(
        [VEGETA, "attack", f"-rate={rate}", f"-duration={seconds}s", "-timeout=5s", "-keepalive=true"],
        input=target.encode(), check=True, capture_output=True).stdout
    return {"rate": rate, **vegeta_summary(attack)}


def vegeta_summary(attack_output):
    """Rate, latencies (ms) and success of a `vegeta attack` output."""
    report = json.loads(subprocess.run([VEGETA, "report", "-type=json"], input=attack_output,
                                       check=True, capture_output=True).stdout)
    lat = report["latencies"]
    return {
        "achieved_rps": report["throughput"],
        "requests": report["requests"],
        "mean_ms": lat["mean"] / 1e6,
        "p50_ms": lat["50th"] / 1e6,
        "p99_ms": lat["99th"] / 1e6,
        "max_ms": lat["max"] / 1e6,
        "success": report["success"],
    }


def wait_for_backend(port, host, body, deadline_s=120):
    start = time.time()
    while time.time() - start < deadline_s:
        try:
            status, got = get(port, host)
            if status == 200 and got.strip() == body:
                return
        except OSError:
            pass
    raise RuntimeError(f"{host} never answered {body!r}")


def switchyard_route_changes(http_port, admin_port, apps, b1, b2, iterations):
    rng = random.Random(apps)
    samples = []
    for n in range(iterations):
        i = rng.randrange(apps)
        host = f"app{i}.bench"
        wait_for_backend(http_port, host, b"b1")  # a live app, routed and cached
        body = json.dumps({"backends": [f"127.0.0.1:{b2}"]})
        start = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=10)
        conn.request("PUT", f"/v1/apps/app{i}/backends", body=body, headers={"Content-Type": "application/json"})
        assert conn.getresponse().status == 200
        conn.close()
        wait_for_backend(http_port, host, b"b2")
        samples.append((time.perf_counter() - start) * 1000)
        # put it back for the next iteration's precondition
        conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=10)
        conn.request("PUT", f"/v1/apps/app{i}/backends", body=json.dumps({"backends": [f"127.0.0.1:{b1}"]}))
        conn.getresponse().read()
        conn.close()
    return summarize(samples)


def nginx_route_changes(proc, port, work, apps, b1, b2, iterations):
    rng = random.Random(apps)
    samples = []
    for n in range(iterations):
        i = rng.randrange(apps)
        host = f"app{i}.bench"
        wait_for_backend(port, host, b"b1")
        start = time.perf_counter()
        (work / "nginx-apps" / f"app{i}.conf").write_text(nginx_app_conf(i, port, b2))
        os.kill(proc.pid, signal.SIGHUP)
        wait_for_backend(port, host, b"b2")
        samples.append((time.perf_counter() - start) * 1000)
        (work / "nginx-apps" / f"app{i}.conf").write_text(nginx_app_conf(i, port, b1))
        os.kill(proc.pid, signal.SIGHUP)
        wait_for_backend(port, host, b"b1")
    return summarize(samples)


def summarize(samples):
    ordered = sorted(samples)
    p99_index = min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))
    return {
        "n": len(ordered),
        "p50_ms": statistics.median(ordered),
        "p99_ms": ordered[p99_index],
        "max_ms": ordered[-1],
        "mean_ms": statistics.fmean(ordered),
    }


def cached_app_memory(work, apps, backend, started):
    """Switchyard's resident memory per cached app: a router with `apps` stored apps, each
    requested once (so each is in the route cache, with its route, counters and domain
    entry), against an empty router after the same warm-up. Routers started are in
    `started` while they run."""
    empty, empty_port, _ = start_switchyard(work, 0, backend, "empty")
    started.append(empty)
    wrk_throughput(empty_port, 3)
    rss_empty = rss_kib(empty.pid)
    empty.stop()
    started.remove(empty)
    router, port, admin = start_switchyard(work, apps, backend, "memory")
    started.append(router)
    wrk_throughput(port, 3)
    rss_idle = rss_kib(router.pid)
    touch_all_apps(port, apps, work)
    rss_touched = rss_kib(router.pid)
    cached = metric(admin, 'switchyard_route_cache_entries{table="apps"}') or 0
    router.stop()
    started.remove(router)
    return {"apps": apps, "apps_cached": cached, "rss_empty_kib": rss_empty, "rss_idle_kib": rss_idle,
            "rss_touched_kib": rss_touched, "bytes_per_app": (rss_touched - rss_empty) * 1024 / apps}


def touch_all_apps(port, apps, work):
    script = work / "touch.lua"
    script.write_text(
        "counter = 0\n"
        "request = function()\n"
        f"  counter = counter + 1\n"
        f"  return wrk.format('GET', '/', {{Host = 'app' .. (counter % {apps}) .. '.bench'}})\n"
        "end\n")
    # One thread, so one counter walks every app in order.
    subprocess.run(["wrk", "-t1", "-c16", "-d25s", "-s", str(script), f"http://127.0.0.1:{port}/"],
                   check=True, capture_output=True)


def metric(admin_port, name):
    _, text = get(admin_port, "admin", "/metrics")
    for line in text.decode().splitlines():
        if line.startswith(name):
            return float(line.split()[-1])
    return None


# ---------------------------------------------------------------- report

def cpu_model():
    return next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                 if l.startswith("model name")), platform.processor())


def host():
    """The machine and commit a section was measured on (tool versions are in the header)."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    return {"machine": f"{cpu_model()}, {os.cpu_count()} cores, kernel {platform.release()}",
            "commit": commit}


def machine():
    cpu = cpu_model()
    mem_kib = int(next(l.split()[1] for l in Path("/proc/meminfo").read_text().splitlines() if l.startswith("MemTotal")))
    versions = {
        "nginx": subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip(),
        "haproxy": subprocess.run(["haproxy", "-v"], capture_output=True, text=True).stdout.splitlines()[0],
        "wrk": (subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.splitlines() or ["wrk"])[0],
        "vegeta": subprocess.run([VEGETA, "-version"], capture_output=True, text=True).stdout.split("\n")[0],
        "switchyard": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                     capture_output=True, text=True).stdout.strip(),
    }
    return {
        "cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(), "versions": versions,
    }


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
        print("no earlier results to merge into; run bench/bench.py first", file=sys.stderr)
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
    for mode, key in (("pool", "isolation"), ("inline", "isolation_inline")):
        for r in section.get(key, []):
            lines.append(f"| {mode} | {r['connections'] or 'none'} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                         f"{(1 - r['success']) * 100:.2f}% | {rate(r)} | {ms(r.get('heavy_p50_ms'))} | "
                         f"{ms(r.get('heavy_p99_ms'))} | {'; '.join(r['heavy_errors']) or 'none'} |")
    return lines


def light_route_targets(isolation, heavy):
    """Seed 001's targets for a light route beside `heavy` connections: p99 within 1.5× of
    the light route alone (the first row), and no timeouts at the most connections."""
    alone = isolation[0]["p99_ms"]
    lines = []
    for r in isolation[1:]:
        ratio = r["p99_ms"] / alone
        lines.append(f"- light p99 with {r['connections']} {heavy} connections ≤ 1.5× alone: measured "
                     f"{ratio:.2f}× → **{'met' if ratio <= 1.5 else 'NOT met'}**")
    last = isolation[-1]
    lines.append(f"- 0% light timeouts at {last['connections']} {heavy} connections: measured "
                 f"{(1 - last['success']) * 100:.2f}% → **{'met' if last['success'] >= 1 else 'NOT met'}**")
    return lines


def waf_report(w, date):
    """The WAF section, from bench/bench_waf.py's measurements."""
    lines = ["", "# WAF and worker pool (bench/bench_waf.py)", "",
             f"Measured on {date}. Both proxies inspect with libmodsecurity 3.0.9 and "
             "Debian's OWASP CRS 3.3.4 (paranoia 1, request bodies inspected, block mode) in front of "
             "the same origin (an nginx answering 200 at once). Switchyard runs inspections on its "
             "worker pool (2 threads); nginx 1.22 uses libnginx-mod-http-modsecurity (2 workers). "
             f"Benign form POSTs, `wrk -t2 -c64` for {w['seconds']} s.", "",
             "| body | Switchyard req/s | nginx + ModSecurity req/s | ratio | errors (Switchyard; nginx) |",
             "|---|---|---|---|---|"]
    ratios = []
    for r in w["throughput"]:
        ratio = r["switchyard"]["rps"] / r["nginx"]["rps"]
        ratios.append((r["body_bytes"], ratio))
        lines.append(f"| {r['body_bytes'] // 1000} KB | {r['switchyard']['rps']:.0f} | {r['nginx']['rps']:.0f} | "
                     f"{ratio:.2f}× | {'; '.join(r['switchyard']['errors']) or 'none'}; "
                     f"{'; '.join(r['nginx']['errors']) or 'none'} |")
    lines += ["", f"Seed 001's question: a light GET route (an app without the WAF) at a constant "
              f"{w['light_rate']} req/s (vegeta, 1 s timeout), alone and while wrk keeps N connections of "
              "50 KB inspected POSTs going through the same router; inspections on the worker pool, then "
              "the same with a router forced to inspect inline on its event loops (`--pool-mode inline`, "
              "what a router without a pool does). Heavy latency is wrk's time to the whole (small) "
              "answer.", ""]
    lines += isolation_table(w, "heavy", "heavy req/s", lambda r: f"{r['heavy_rps']:.0f}")
    lines += ["", "## Targets (issue 7)", ""] + light_route_targets(w["isolation"], "heavy")
    for size, ratio in ratios:
        lines.append(f"- WAF-inspected req/s ≥ 3× nginx + ModSecurity ({size // 1000} KB bodies): measured "
                     f"{ratio:.2f}× → **{'met' if ratio >= 3 else 'NOT met'}**")
    return lines


def images_report(m, date):
    """The image-resizing section, from bench/bench_images.py's measurements."""
    lines = ["", "# Image resizing on the worker pool (bench/bench_images.py)", "",
             f"Measured on {date}. `GET {m['thumbnail']}`: a {m['width']}×{m['height']} JPEG "
             f"original ({m['original_bytes'] / 1000:.0f} KB) fetched from the app, decoded, shrunk and encoded "
             f"on the worker pool (2 threads). Alone, 64 connections: **{m['alone_rps']:.0f} thumbnails/s** "
             f"({'; '.join(m['alone_errors']) or 'no errors'}). Then seed 001's question: a light GET route "
             f"at a constant {m['light_rate']} req/s (vegeta, 1 s timeout), alone and while wrk keeps N "
             "connections asking for thumbnails; resizing on the worker pool, then the same with a "
             "router forced to resize inline on its event loops (`--pool-mode inline`). wrk is "
             "closed-loop: a client refused with 503 (Retry-After) asks again at once, so the "
             "refusals are part of the load.", ""]
    lines += isolation_table(m, "thumbnail", "thumbnails/s", lambda r: f"{r.get('thumbnails_per_s', 0):.0f}")
    lines += ["", "## Targets (issue 7, images)", ""] + light_route_targets(m["isolation"], "thumbnail")
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
    started = []
    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
               "apps_for_load": load_apps, "throughput": {}, "latency": {}, "route_change": [],
               "nginx_start": {}, "targets": []}
    try:
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
        rss_empty_proxy = None
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
    finally:
        for p in reversed(started):
            p.stop()

    out = ROOT / "bench" / ("RESULTS-quick.md" if args.quick else "RESULTS.md")
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    latest = ROOT / "bench" / "results" / ("quick.json" if args.quick else "latest.json")
    # The other scripts' sections (https, fleet, mirror, cache, waf) stay as they were measured.
    if latest.exists():
        earlier = json.loads(latest.read_text())
        results = {**{k: v for k, v in earlier.items() if k not in results}, **results}
    write_report(results, out)
    latest.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
