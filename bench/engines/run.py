#!/usr/bin/env python3
"""The cost of a request and of a connection, per proxy, in one run on one machine: nginx,
HAProxy, Switchyard, and the engine floors of bench/engines (a bare Pingora proxy with
Switchyard's settings, a shared-nothing hyper proxy laid out as nginx's workers, and the
same layout on Switchyard's own HTTP/1 codec, crates/h1).

Every proxy gets 2 worker threads/processes, no access log, keep-alive to the backend, and
one route (Host app7.bench → an nginx origin answering "ok"). Per proxy:
- CPU per request at a constant rate: vegeta (open loop) at --rate req/s for --seconds over
  HTTP keep-alive, then HTTPS keep-alive (HTTP/1.1 over TLS), then at --tls-new-rate with a
  new HTTPS connection per request (a full TLS 1.3 handshake each: Go keeps no session
  cache); utime+stime of the proxy's processes (all of them: nginx's workers too) during the
  run, divided by the requests answered. The steadier figure on 2 shared cores. Latency
  percentiles and the share answered, of the same runs. One ECDSA P-256 certificate.
- backend connections opened per 10,000 requests, in that run: the origin's accepted
  connections (nginx stub_status) before and after.
- closed-loop throughput: wrk -t2 -c64, median of 3 runs, each after the machine is quiet,
  beside the proxy's own CPU per request in them, its share of the 2 cores (wrk and the
  origin share them too: closed-loop req/s is that share over the CPU per request) and
  the origin's connections per 10k requests (a proxy that churns its backend connections
  shows there). nginx's upstream keeps 256 idle connections per worker: with 64 clients
  and the seed's `keepalive 16` it opened 2,300 connections per 10k requests and ran at
  0.66× its own figure with 256 (bench/ENGINE.md, 2026-12-07), which flattered the others.
- idle CPU: CPU time the proxy used over --idle-seconds with no traffic, after the load,
  with no connection open and again with --connections idle keep-alive connections held;
  beside it the wake-ups a second of all its threads (context switches), the finer figure
  where CPU time counts in 10 ms ticks.
- memory per idle keep-alive client connection: resident set growth (all its processes)
  with --connections client connections open, each having had one request answered.
- memory per idle WebSocket: bench/conformance/websockets.py's measurement (an echo backend,
  --websockets WebSockets opened, one message each, held, a second message each).
- Switchyard's memory per cached app: resident set of a router with --apps stored apps, each
  requested once, less that of an empty router after the same warm-up, per app.

Results: bench/results/engines.json and the tables in bench/ENGINE.md (between the
"measured" markers; the rest of that file is prose kept by hand). Everything listens on
127.0.0.1; every process is stopped by its PID.
"""

import argparse
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "conformance"))
import bench  # noqa: E402
import websockets as ws_bench  # noqa: E402
# Two modules are called `report`: bench/conformance's (which websockets imports) and
# bench's, the benchmark report this script adds its section to; the latter is loaded
# under its own name.
_report_spec = importlib.util.spec_from_file_location("bench_report", HERE.parent / "report.py")
report = importlib.util.module_from_spec(_report_spec)
_report_spec.loader.exec_module(report)
from bench import (ROOT, Process, free_port, nginx_app_conf, nginx_conf, put_app,  # noqa: E402
                   start_nginx_origin, wait_port)

HOST = "app7.bench"
TARGET = ROOT / "target" / "release"
RESULTS = ROOT / "bench" / "results" / "engines.json"
REPORT = ROOT / "bench" / "ENGINE.md"
MARK_START = "<!-- measured: written by bench/engines/run.py -->"
MARK_END = "<!-- end of measured -->"


# ------------------------------------------------------------------ process accounting

def resident_kib(pid):
    return sum(bench.rss_kib(p) for p in bench.process_tree(pid))


# ------------------------------------------------------------------ the proxies

def start_origin(work):
    port, status = free_port(), free_port()
    proc = start_nginx_origin(work, "origin", f"""
    server {{ listen 127.0.0.1:{port} backlog=4096; location / {{ return 200 "ok\\n"; }} }}
    server {{ listen 127.0.0.1:{status}; location / {{ stub_status; }} }}""",
                              [port, status], worker_connections=8192)
    return proc, port, status


def origin_accepts(status_port):
    """Connections the origin has accepted so far, less this status request's own."""
    with socket.create_connection(("127.0.0.1", status_port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        text = b""
        while chunk := s.recv(4096):
            text += chunk
    counters = text.split(b"\r\n\r\n", 1)[1].decode().splitlines()[2].split()
    return int(counters[0]) - 1


def make_certificate(work):
    """A self-signed ECDSA P-256 certificate for HOST: (certificate, key, both in one file)."""
    cert, key, both = work / "cert.pem", work / "key.pem", work / "both.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-days", "2", "-subj", f"/CN={HOST}", "-addext", f"subjectAltName=DNS:{HOST}",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    both.write_text(cert.read_text() + key.read_text())
    return cert, key, both


def start_nginx(work, backend, host=HOST, tls=None, workers=2, wrap=()):
    """nginx with `workers` worker processes; `wrap`, a command to run it under (valgrind:
    then without a master process, the one worker being the process measured)."""
    port = free_port()
    apps = work / "nginx-apps"
    apps.mkdir(exist_ok=True)
    # Idle upstream connections kept per worker: more than the closed loop's 64 clients, as
    # a platform would size it (with the seed's 16, nginx churned its backend connections).
    app = (nginx_app_conf(7, port, backend).replace("app7.bench", host)
           .replace("keepalive 16;", "keepalive 256;"))
    tls_port = None
    if tls:
        tls_port = free_port()
        # The same server block, also listening with TLS (no HTTP/2: the others speak
        # HTTP/1.1 to vegeta too). nginx 1.22 leaves TLS 1.3 off unless asked; the others
        # negotiate it, so without this line nginx's handshakes were TLS 1.2 ones.
        # HTTP/2 offered by ALPN on the TLS port, as the others offer it (vegeta's runs ask
        # for HTTP/1.1; h2load's for h2).
        app = app.replace(f"listen 127.0.0.1:{port};",
                          f"listen 127.0.0.1:{port};\n    listen 127.0.0.1:{tls_port} ssl http2;\n"
                          f"    ssl_protocols TLSv1.2 TLSv1.3;\n"
                          f"    ssl_certificate {tls[0]};\n    ssl_certificate_key {tls[1]};")
    (apps / "app7.conf").write_text(app)
    conf = work / "nginx.conf"
    text = nginx_conf(work, port).replace("events { worker_connections 8192; }",
                                          "events { worker_connections 16384; }")
    text = text.replace(f"worker_processes {bench.THREADS};", f"worker_processes {workers};")
    conf.write_text(("master_process off;\n" if wrap else "") + text)
    proc = Process("nginx", [*wrap, "nginx", "-c", str(conf), "-p", str(work)], work)
    wait_port(port, timeout=180)
    proc.tls_port = tls_port
    return proc, port


def start_haproxy(work, backend, host=HOST, tls=None, threads=2, wrap=()):
    port = free_port()
    tls_port = free_port() if tls else None
    tls_bind = f"\n    bind 127.0.0.1:{tls_port} ssl crt {tls[2]} alpn h2,http/1.1" if tls else ""
    conf = work / "haproxy.cfg"
    conf.write_text(f"""global
    nbthread {threads}
    # Two descriptors per proxied connection; this machine's hard limit is 20,000.
    maxconn 9000
defaults
    mode http
    timeout connect 3s
    timeout client 60s
    timeout server 60s
    timeout tunnel 1h
    option http-keep-alive
frontend web
    bind 127.0.0.1:{port}{tls_bind}
    use_backend app if {{ req.hdr(host),lower,word(1,:) -m str {host} }}
    default_backend notfound
backend notfound
    http-request deny deny_status 404
backend app
    http-reuse always
    server s1 127.0.0.1:{backend}
""")
    proc = Process("haproxy", [*wrap, "haproxy", "-db", "-f", str(conf)], work)
    wait_port(port, timeout=180)
    proc.tls_port = tls_port
    return proc, port


def start_switchyard(work, backend, host=HOST, tls=None, threads=2, wrap=(), binary=None,
                     app_options=None):
    """Switchyard, on hyper since the engine change (commit 2fef383; Pingora's code was
    removed after it, and its rows in the earlier runs are kept below for comparison).
    `wrap`: a command to run it under (valgrind); `binary`: another build than
    target/release's (an earlier commit's, for a before/after in one run); `app_options`:
    settings added to the app's (bench/engines/price_list.py: one stage switched on)."""
    port, admin = free_port(), free_port()
    tls_port = free_port() if tls else None
    cert = ["--default-cert", str(tls[0]), "--default-key", str(tls[1])] if tls else []
    listeners = ["--https", f"127.0.0.1:{tls_port}", *cert] if tls_port else ["--https", "off"]
    name = f"switchyard-{port}"
    proc = Process(name, [
        *wrap, str(binary or bench.BIN), "serve", "--http", f"127.0.0.1:{port}", *listeners,
        "--admin", f"127.0.0.1:{admin}", "--data-dir", str(work / f"{name}-data"),
        "--access-log", "off", "--shutdown-grace-s", "0", "--threads", str(threads), "--waf", "off",
    ], work, env={**os.environ, "RUST_LOG": "warn"})
    for listening in (port, admin, tls_port):
        if listening:
            wait_port(listening, timeout=180)
    put_app(admin, "app7", {"domains": [host], "backends": [f"127.0.0.1:{backend}"],
                            **(app_options or {})})
    proc.tls_port = tls_port
    return proc, port


def floor_starter(binary):
    def start(work, backend, host=HOST, tls=None, threads=2, wrap=()):
        port = free_port()
        tls_port = free_port() if tls else None
        tls_args = (["--tls-listen", f"127.0.0.1:{tls_port}", "--cert", str(tls[0]),
                     "--key", str(tls[1])] if tls else [])
        proc = Process(f"{binary}-{port}", [*wrap, str(TARGET / binary), "--listen", f"127.0.0.1:{port}",
                                            "--threads", str(threads), "--route",
                                            f"{host}=127.0.0.1:{backend}", *tls_args], work)
        wait_port(port, timeout=180)
        if tls_port:
            wait_port(tls_port, timeout=180)
        proc.tls_port = tls_port
        return proc, port
    return start


def start_switchyard_before(work, backend, **options):
    """Switchyard built from an earlier commit, at $SWITCHYARD_BEFORE_BIN."""
    before = os.environ.get("SWITCHYARD_BEFORE_BIN")
    if not before:
        raise SystemExit("switchyard-before: set SWITCHYARD_BEFORE_BIN to an earlier build")
    return start_switchyard(work, backend, binary=before, **options)


PROXIES = {
    "nginx": start_nginx,
    "switchyard-before": start_switchyard_before,
    "haproxy": start_haproxy,
    "switchyard": start_switchyard,
    "pingora-floor": floor_starter("pingora-floor"),
    "hyper-floor": floor_starter("hyper-floor"),
    "h1-floor": floor_starter("h1-floor"),
}


# ------------------------------------------------------------------ measurements

def constant_rate(proxy, port, status_port, rate, seconds, scheme="http", keepalive=True):
    target = f"GET {scheme}://127.0.0.1:{port}/\nHost: {HOST}\n"
    accepts_before, cpu_before = origin_accepts(status_port), bench.tree_cpu_seconds(proxy.pid)
    # At most 64 requests under way: past that, a late answer would make vegeta open yet
    # another connection (a handshake each over TLS) and tip the machine into a storm of
    # thousands of them; a proxy that falls behind shows it as a lower rate achieved.
    # HTTP/1.1 over TLS for all: vegeta would otherwise take HTTP/2 from the proxies that
    # offer it. It sends no server name to 127.0.0.1, so each proxy answers with its default
    # certificate (the same one for all).
    attack = subprocess.run(
        [bench.VEGETA, "attack", f"-rate={rate}", f"-duration={seconds}s", "-timeout=5s",
         f"-keepalive={'true' if keepalive else 'false'}", "-connections=64", "-workers=64",
         "-max-workers=64", "-http2=false", "-insecure"],
        input=target.encode(), check=True, capture_output=True).stdout
    cpu = bench.tree_cpu_seconds(proxy.pid) - cpu_before
    accepts = origin_accepts(status_port) - accepts_before
    summary = bench.vegeta_summary(attack)
    answered = max(int(summary["requests"] * summary["success"]), 1)
    return {
        **summary,
        "cpu_s": cpu,
        "cpu_us_per_request": cpu * 1e6 / answered,
        "backend_connections": accepts,
        "backend_connections_per_10k": accepts * 10_000 / answered,
    }


# The proxies that speak HTTP/2 to clients (the floors speak HTTP/1.1 only).
HTTP2 = {"nginx", "haproxy", "switchyard"}


def http2_constant_rate(proxy, tls_port, rate, seconds, clients=16, streams=10):
    """CPU per request over HTTP/2 (TLS, ALPN h2) at a constant rate: h2load with `clients`
    connections of up to `streams` concurrent streams each, as browsers multiplex."""
    cpu_before = bench.tree_cpu_seconds(proxy.pid)
    out = subprocess.run(
        ["h2load", f"--clients={clients}", f"--max-concurrent-streams={streams}",
         f"--rps={max(rate // clients, 1)}", f"--duration={seconds}",
         "-H", f":authority: {HOST}", f"https://127.0.0.1:{tls_port}/"],
        check=True, capture_output=True, text=True).stdout
    cpu = bench.tree_cpu_seconds(proxy.pid) - cpu_before
    counts = next(line for line in out.splitlines() if line.startswith("requests:"))
    numbers = [int(word) for word in counts.replace(",", " ").split() if word.isdigit()]
    total, succeeded = numbers[0], numbers[3]
    # No warm-up window: the CPU and the requests counted cover the same run (the 16
    # handshakes in it cost about 1% of the requests' CPU).
    return {"requests": total, "succeeded": succeeded, "cpu_s": cpu,
            "cpu_us_per_request": cpu * 1e6 / max(succeeded, 1), "achieved_rps": succeeded / seconds,
            "success": succeeded / max(total, 1)}


def http2_closed_loop(proxy, tls_port, seconds, clients=16, streams=10):
    """HTTP/2 over TLS as fast as answered: h2load with `clients` connections of `streams`
    concurrent streams each and no rate; req/s and the proxy's CPU per request in it."""
    cpu_before = bench.tree_cpu_seconds(proxy.pid)
    out = subprocess.run(
        ["h2load", f"--clients={clients}", f"--max-concurrent-streams={streams}",
         f"--duration={seconds}", "-H", f":authority: {HOST}", f"https://127.0.0.1:{tls_port}/"],
        check=True, capture_output=True, text=True).stdout
    cpu = bench.tree_cpu_seconds(proxy.pid) - cpu_before
    counts = next(line for line in out.splitlines() if line.startswith("requests:"))
    numbers = [int(word) for word in counts.replace(",", " ").split() if word.isdigit()]
    total, succeeded = numbers[0], numbers[3]
    return {"requests": total, "succeeded": succeeded, "rps": succeeded / seconds,
            "cpu_us_per_request": cpu * 1e6 / max(succeeded, 1),
            "cpu_share": cpu / seconds / bench.THREADS, "success": succeeded / max(total, 1)}


def closed_loop(proxy, port, status_port, seconds):
    runs = []
    for _ in range(3):
        bench.wait_for_quiet()
        cpu_before, accepts_before = bench.tree_cpu_seconds(proxy.pid), origin_accepts(status_port)
        rps, errors = bench.wrk_throughput(port, seconds, host=HOST)
        cpu = bench.tree_cpu_seconds(proxy.pid) - cpu_before
        answered = max(rps * seconds, 1)
        runs.append({"rps": rps, "errors": errors, "cpu_us_per_request": cpu * 1e6 / answered,
                     "cpu_share": cpu / seconds / bench.THREADS,
                     "origin_connections_per_10k": (origin_accepts(status_port) - accepts_before)
                     * 10_000 / answered})
    median = lambda key: statistics.median(run[key] for run in runs)  # noqa: E731
    return {"runs_rps": [run["rps"] for run in runs], "median_rps": median("rps"),
            "cpu_us_per_request": median("cpu_us_per_request"), "cpu_share": median("cpu_share"),
            "origin_connections_per_10k": median("origin_connections_per_10k"),
            "errors": [run["errors"] for run in runs if run["errors"]]}


def context_switches(pid):
    """Voluntary and involuntary context switches of every thread of the process tree."""
    total = 0
    for process in bench.process_tree(pid):
        for status in Path(f"/proc/{process}/task").glob("*/status"):
            try:
                lines = status.read_text().splitlines()
            except OSError:
                continue  # a thread that ended meanwhile
            total += sum(int(line.split()[1]) for line in lines if "ctxt_switches" in line)
    return total


def idle_cpu(proxy, seconds):
    before, switches = bench.tree_cpu_seconds(proxy.pid), context_switches(proxy.pid)
    time.sleep(seconds)
    return {"seconds": seconds, "cpu_ms_per_s": (bench.tree_cpu_seconds(proxy.pid) - before) * 1000 / seconds,
            "wakes_per_s": (context_switches(proxy.pid) - switches) / seconds}


def keepalive_memory(proxy, port, count, idle_seconds):
    """Resident growth per idle keep-alive client connection that had one request answered,
    and the idle CPU while they are held."""
    time.sleep(1)
    before = resident_kib(proxy.pid)
    sockets = []
    try:
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(f"GET / HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
            answer = b""
            while b"ok\n" not in answer:
                chunk = s.recv(4096)
                if not chunk:
                    raise RuntimeError(f"connection closed after {answer[:80]!r}")
                answer += chunk
            sockets.append(s)
        time.sleep(1)
        held = resident_kib(proxy.pid)
        idle = idle_cpu(proxy, idle_seconds)
    finally:
        for s in sockets:
            s.close()
    return {"connections": count, "rss_before_kib": before, "rss_held_kib": held,
            "bytes_per_connection": (held - before) * 1024 / count, "idle": idle}


def measure_proxy(name, start, work, args, procs, tls):
    origin, backend, status_port = start_origin(work)
    procs.append(origin)
    proxy, port = start(work, backend, tls=tls)
    procs.append(proxy)
    bench.get(port, HOST)  # warm: routes, pools
    tls_port = proxy.tls_port
    result = {
        "constant_rate": constant_rate(proxy, port, status_port, args.rate, args.seconds),
        # A target without HTTPS has no HTTPS runs.
        "https_keepalive": tls_port and constant_rate(proxy, tls_port, status_port, args.rate,
                                                      args.seconds, scheme="https"),
        "https_new_connection": tls_port and constant_rate(proxy, tls_port, status_port,
                                                           args.tls_new_rate, args.seconds,
                                                           scheme="https", keepalive=False),
        "http2_tls": (tls_port and name in HTTP2
                      and http2_constant_rate(proxy, tls_port, args.rate, args.seconds)) or None,
        "closed_loop": closed_loop(proxy, port, status_port, max(args.seconds // 2, 3)),
        "idle": idle_cpu(proxy, args.idle_seconds),
        "keepalive_memory": keepalive_memory(proxy, port, args.connections, args.idle_seconds),
    }
    proxy.stop()
    origin.stop()
    ws = ws_bench.measure(name, lambda w, b: start(w, b, host="ws.test"), work, args.websockets, 2)
    result["websocket_memory"] = {k: ws[k] for k in ("opened", "second_echo", "rss_before_kib",
                                                     "rss_held_kib", "bytes_per_connection")}
    return result


def cached_app_memory(work, apps, procs):
    """The library's memory-per-cached-app measurement (bench.cached_app_memory), against this script's origin."""
    origin, backend, _ = start_origin(work)
    procs.append(origin)
    result = bench.cached_app_memory(work, apps, backend, procs)
    origin.stop()
    return result


# ------------------------------------------------------------------ report

def commit():
    """HEAD's short hash, marked when the tree differs from it (figures of uncommitted code)."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    changed = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                             capture_output=True, text=True).stdout.strip()
    return f"{head} with uncommitted changes" if changed else head


CPU_RUNS = [("constant_rate", "HTTP keep-alive"), ("https_keepalive", "HTTPS keep-alive"),
            ("https_new_connection", "HTTPS, new connection per request")]
HTTP2_RUN = ("http2_tls", "HTTP/2 over TLS (h2load, 16 connections × 10 streams)")


def ratio(value, base):
    return f"{value / base:.2f}×" if base else "–"


def idle(measured):
    return f"{measured['cpu_ms_per_s']:.1f} ({measured['wakes_per_s']:.0f})" if measured else "–"


def table(results):
    proxies = results["proxies"]
    nginx = proxies.get("nginx")
    rows = [
        "| proxy | run | CPU µs/request | vs nginx | req/s achieved | answered | p50 ms | p99 ms | "
        "p99 vs nginx |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in proxies.items():
        for key, label in CPU_RUNS:
            c, base = r[key], nginx and nginx[key]
            if not c:
                rows.append(f"| {name} | {label} | not served | | | | | | |")
                continue
            rows.append(
                f"| {name} | {label} | {c['cpu_us_per_request']:.0f} | "
                f"{ratio(c['cpu_us_per_request'], base and base['cpu_us_per_request'])} | "
                f"{c['achieved_rps']:.0f} | {c['success'] * 100:.1f}% | {c['p50_ms']:.2f} | {c['p99_ms']:.2f} | "
                f"{ratio(c['p99_ms'], base and base['p99_ms'])} |")
        c, base = r.get(HTTP2_RUN[0]), nginx and nginx.get(HTTP2_RUN[0])
        if c:
            rows.append(
                f"| {name} | {HTTP2_RUN[1]} | {c['cpu_us_per_request']:.0f} | "
                f"{ratio(c['cpu_us_per_request'], base and base['cpu_us_per_request'])} | "
                f"{c['achieved_rps']:.0f} | {c['success'] * 100:.1f}% | | | |")
    rows += [
        "",
        "| proxy | backend conns / 10k req (HTTP run) | closed-loop req/s (median of 3) | vs nginx | "
        "closed-loop µs/req, share of the cores, origin conns / 10k | "
        "idle CPU ms/s (wakes/s): none open / keep-alive conns held | KiB per keep-alive conn | KiB per idle WebSocket | vs nginx |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in proxies.items():
        c, loop = r["constant_rate"], r["closed_loop"]
        # Older result files have the throughput only.
        loop_cpu = (f"{loop['cpu_us_per_request']:.1f}, {loop['cpu_share'] * 100:.0f}%, "
                    f"{loop['origin_connections_per_10k']:.1f}" if "cpu_share" in loop else "–")
        ka, wsm = r["keepalive_memory"], r["websocket_memory"]
        rows.append(
            f"| {name} | {c['backend_connections_per_10k']:.1f} | {loop['median_rps']:.0f} | "
            f"{ratio(loop['median_rps'], nginx and nginx['closed_loop']['median_rps'])} | {loop_cpu} | "
            f"{idle(r['idle'])} / {idle(ka.get('idle'))} | {ka['bytes_per_connection'] / 1024:.1f} | "
            f"{wsm['bytes_per_connection'] / 1024:.1f} | "
            f"{ratio(wsm['bytes_per_connection'], nginx and nginx['websocket_memory']['bytes_per_connection'])} |")
    for router_name, floor_name in (("switchyard", "hyper-floor"), ("switchyard", "h1-floor"),
                                    ("h1-floor", "hyper-floor")):
        router, floor = proxies.get(router_name), proxies.get(floor_name)
        if router and floor:
            over = ", ".join(
                f"{label} {ratio(router[key]['cpu_us_per_request'], floor[key]['cpu_us_per_request'])}"
                for key, label in CPU_RUNS if router[key] and floor[key])
            rows += ["", f"{router_name}'s CPU per request over {floor_name}'s: {over}."]
    if results.get("cached_app_memory"):
        rows += ["", report.cached_app_memory_sentence(results["cached_app_memory"])]
    return rows


def headline(results):
    return {"date": results["date"], "commit": results["commit"],
            "proxies": {name: {"cpu_us_http": r["constant_rate"]["cpu_us_per_request"],
                               "cpu_us_https_keepalive": (r["https_keepalive"] or {}).get("cpu_us_per_request"),
                               "cpu_us_https_new": (r["https_new_connection"] or {}).get("cpu_us_per_request"),
                               "cpu_us_http2": (r.get("http2_tls") or {}).get("cpu_us_per_request"),
                               "closed_loop_rps": r["closed_loop"]["median_rps"],
                               "backend_connections_per_10k": r["constant_rate"]["backend_connections_per_10k"],
                               "websocket_kib": r["websocket_memory"]["bytes_per_connection"] / 1024}
                        for name, r in results["proxies"].items()}}


def earlier_runs():
    """The previous full run's headline and the ones it kept, newest first."""
    if not RESULTS.exists():
        return []
    previous = json.loads(RESULTS.read_text())
    return [headline(previous), *previous.get("earlier_runs", [])]


def micro(value):
    return "–" if value is None else f"{value:.0f}"


def earlier_table(runs):
    rows = ["", "Earlier runs (CPU µs per request HTTP / HTTPS keep-alive / HTTPS new connection; "
            "closed-loop req/s; backend connections per 10k requests; KiB per idle WebSocket):", "",
            "| run | proxy | CPU µs/req | req/s | backend conns / 10k | KiB / WebSocket |",
            "|---|---|---|---|---|---|"]
    for run in runs:
        for name, p in run["proxies"].items():
            rows.append(f"| {run['date']}, {run['commit']} | {name} | {p['cpu_us_http']:.0f} / "
                        f"{micro(p['cpu_us_https_keepalive'])} / {micro(p['cpu_us_https_new'])} | "
                        f"{p['closed_loop_rps']:.0f} | {p['backend_connections_per_10k']:.1f} | "
                        f"{p['websocket_kib']:.1f} |")
    return rows if runs else []


def write_report(results):
    lines = [
        MARK_START,
        f"Measured by `bench/engines/run.py` on {results['date']}, {results['machine']}, "
        f"Switchyard at commit {results['commit']}; load generators, origin and proxy share the "
        f"2 cores, so take the ratios. Constant rate: {results['rate']} req/s for "
        f"{results['seconds']} s (vegeta, 64 connections; HTTP/1.1 over TLS), new HTTPS "
        f"connections at {results['tls_new_rate']}/s; closed loop: wrk -t2 -c64 over HTTP; "
        f"{results['connections']} idle keep-alive connections; {results['websockets']} idle "
        f"WebSockets.",
        "",
        *table(results),
        *earlier_table(results.get("earlier_runs", [])),
        MARK_END,
    ]
    text = REPORT.read_text() if REPORT.exists() else f"# The engine\n\n{MARK_START}\n{MARK_END}\n"
    head, _, rest = text.partition(MARK_START)
    _, _, tail = rest.partition(MARK_END)
    REPORT.write_text(head + "\n".join(lines) + tail)


def refuse_stale_binary():
    """The figures are reported against HEAD's commit: a release binary older than the last
    commit of the router's code would be measured under the wrong name (this run does not
    build; `cargo build --release` first)."""
    changed = subprocess.run(["git", "log", "-1", "--format=%ct", "--", "crates", "src", "Cargo.lock"],
                             cwd=ROOT, capture_output=True, text=True).stdout.strip()
    if changed and bench.BIN.exists() and bench.BIN.stat().st_mtime < int(changed):
        sys.exit(f"{bench.BIN} is older than the last commit of the router's code: "
                 "run `cargo build --release` first")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=10, help="constant-rate run length")
    parser.add_argument("--rate", type=int, default=2000, help="constant rate, req/s")
    parser.add_argument("--tls-new-rate", type=int, default=500,
                        help="constant rate of new HTTPS connections (one request each), per s")
    parser.add_argument("--idle-seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=2000, help="idle keep-alive connections held")
    parser.add_argument("--websockets", type=int, default=2000, help="idle WebSockets held")
    parser.add_argument("--only", action="append", choices=sorted(PROXIES), help="measure only these")
    parser.add_argument("--apps", type=int, default=100_000,
                        help="stored apps for Switchyard's memory per cached app (0: skip)")
    parser.add_argument("--quick", action="store_true", help="3 s runs, 200 connections (smoke test)")
    args = parser.parse_args()
    refuse_stale_binary()
    if args.quick:
        args.seconds, args.idle_seconds, args.connections, args.websockets = 3, 2, 200, 200
        args.apps = min(args.apps, 10_000)
    work = Path(tempfile.mkdtemp(prefix="switchyard-bench-engines-"))
    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "machine": bench.host()["machine"], "tools": bench.machine()["versions"],
               "commit": commit(), "rate": args.rate, "tls_new_rate": args.tls_new_rate, "seconds": args.seconds,
               "connections": args.connections, "websockets": args.websockets, "proxies": {}}
    tls = make_certificate(work)
    # An earlier build is measured only when asked for.
    everyone = [name for name in PROXIES
                if name != "switchyard-before" or os.environ.get("SWITCHYARD_BEFORE_BIN")]
    for name in args.only or everyone:
        with bench.Started() as procs:
            print(f"measuring {name} …", flush=True)
            results["proxies"][name] = measure_proxy(name, PROXIES[name], work, args, procs, tls)
    if args.apps and "switchyard" in (args.only or PROXIES):
        with bench.Started() as procs:
            print(f"measuring switchyard's memory per cached app ({args.apps} apps) …", flush=True)
            results["cached_app_memory"] = cached_app_memory(work, args.apps, procs)
    print("\n".join(table(results)))
    if args.quick or args.only:
        print("(a partial or quick run: bench/ENGINE.md and bench/results are left as they are)")
        return 0
    results["earlier_runs"] = earlier_runs()
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    write_report(results)
    report.merge_section("engines", results, quick=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
