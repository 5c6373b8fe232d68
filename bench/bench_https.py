#!/usr/bin/env python3
"""HTTPS side by side: Switchyard (certificates in its store, chosen by SNI, parsed lazily)
and nginx (one server block and one certificate file per app), 1,000 apps, on this machine.

Measurements, added to bench/results/latest.json under "https" and to bench/RESULTS.md:
- constant-rate latency with vegeta at 100/500/1000/2000 req/s over HTTP/1.1+TLS, with
  keep-alive and with a new connection (full handshake) per request;
- closed-loop full-handshake rate: vegeta at max rate, no keep-alive, 64 workers (Go's client
  keeps no session cache, so every request is a full TLS 1.3 handshake);
- Switchyard start-up time (process start → first HTTPS answer) and resident memory with
  10,000 and 100,000 certificates stored;
- cold vs warm certificate: handshake time for 300 names never seen by the router, then for
  the same names again (Python's ssl client; its own overhead is in both figures).
"""

import argparse
import json
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench as common
import report

HOT = "app7.bench"
RATES = [100, 500, 1000, 2000]


def seed(work, tag, apps, certs, backend, pem_files=0):
    data = work / f"switchyard-data-{tag}"
    shutil.rmtree(data, ignore_errors=True)
    args = [str(common.BIN), "bench-seed", "--data-dir", str(data), "--apps", str(apps),
            "--backend", f"127.0.0.1:{backend}", "--certs", str(certs)]
    if pem_files:
        args += ["--pem-dir", str(work / "pem"), "--pem-files", str(pem_files)]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    return data


def start_switchyard(work, data, tag):
    http_port, https_port, admin_port = common.free_port(), common.free_port(), common.free_port()
    started = time.perf_counter()
    proc = common.Process(f"switchyard-https-{tag}", [
        str(common.BIN), "serve", "--http", f"127.0.0.1:{http_port}",
        "--https", f"127.0.0.1:{https_port}", "--admin", f"127.0.0.1:{admin_port}",
        "--data-dir", str(data), "--threads", str(common.THREADS), "--access-log", "off",
        "--shutdown-grace-s", "0",
    ], work, env={"RUST_LOG": "warn", "PATH": "/usr/bin:/bin"})
    return proc, https_port, admin_port, started


def first_https_answer(port, name, started, timeout=60):
    """Seconds from `started` until a TLS handshake for `name` and a request succeed."""
    ctx = insecure_context()
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as raw:
                with ctx.wrap_socket(raw, server_hostname=name) as tls:
                    tls.sendall(f"GET / HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
                    if tls.recv(12).startswith(b"HTTP/1.1 200"):
                        return time.perf_counter() - started
        except OSError:
            time.sleep(0.005)
    raise RuntimeError(f"no HTTPS answer for {name} within {timeout}s")


def insecure_context():
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def nginx_https_conf(work, port, apps, backend):
    blocks = []
    for i in range(apps):
        blocks.append(f"""server {{
    listen 127.0.0.1:{port} ssl;
    server_name app{i}.bench;
    ssl_certificate {work}/pem/app{i}.bench.pem;
    ssl_certificate_key {work}/pem/app{i}.bench.key;
    location / {{
        proxy_pass http://origin;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $host;
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        proxy_set_header X-Forwarded-Proto $scheme;
    }}
}}
""")
    (work / "nginx-https-apps.conf").write_text("".join(blocks))
    return common.nginx_proxy_conf(work, "nginx-https", f"""\
    ssl_protocols TLSv1.2 TLSv1.3;
    upstream origin {{ server 127.0.0.1:{backend}; keepalive 64; }}
    include {work}/nginx-https-apps.conf;""")


def vegeta(port, rate, seconds, keepalive, workers=None):
    target = f"GET https://{HOT}/\n"
    args = [common.VEGETA, "attack", f"-rate={rate}", f"-duration={seconds}s", "-timeout=5s",
            f"-keepalive={'true' if keepalive else 'false'}", "-insecure", "-http2=false",
            "-connect-to", f"{HOT}:443:127.0.0.1:{port}"]
    if workers:
        args += [f"-max-workers={workers}", f"-workers={workers}"]
    attack = subprocess.run(args, input=target.encode(), check=True, capture_output=True).stdout
    report = json.loads(subprocess.run([common.VEGETA, "report", "-type=json"], input=attack,
                                       check=True, capture_output=True).stdout)
    lat = report["latencies"]
    return {
        "rate": rate, "keepalive": keepalive,
        "mean_ms": lat["mean"] / 1e6, "p50_ms": lat["50th"] / 1e6, "p99_ms": lat["99th"] / 1e6,
        "max_ms": lat["max"] / 1e6, "success": report["success"],
        "achieved_rps": report["throughput"], "errors": report.get("errors") or [],
    }


def handshake_ms(port, name, ctx):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        start = time.perf_counter()
        with ctx.wrap_socket(raw, server_hostname=name):
            return (time.perf_counter() - start) * 1000


def cold_vs_warm(port, first, count):
    ctx = insecure_context()
    names = [f"app{i}.bench" for i in range(first, first + count)]
    cold = [handshake_ms(port, n, ctx) for n in names]
    warm = [handshake_ms(port, n, ctx) for n in names]
    return {"names": count, "cold": common.summarize(cold), "warm": common.summarize(warm)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="short runs, 10,000 certificates at most")
    args = parser.parse_args()
    seconds = 3 if args.quick else args.seconds
    apps = 1000
    startup_sizes = [10000] if args.quick else [10000, 100000]

    work = Path(tempfile.mkdtemp(prefix="switchyard-bench-https-"))
    results = {"apps": apps, "latency": {}, "handshake_rate": {}, "startup": [], "cold_vs_warm": None}
    with common.Started() as started_procs:
        origin, b1, _ = common.start_origin(work)
        started_procs.append(origin)
        data = seed(work, "load", apps, apps, b1, pem_files=apps)
        sy, sy_port, _, sy_started = start_switchyard(work, data, "load")
        started_procs.append(sy)
        first_https_answer(sy_port, HOT, sy_started)
        ng_port = common.free_port()
        conf = work / "nginx-https.conf"
        conf.write_text(nginx_https_conf(work, ng_port, apps, b1))
        ng = common.Process("nginx-https", ["nginx", "-c", str(conf), "-p", str(work)], work)
        started_procs.append(ng)
        common.wait_port(ng_port, timeout=120)
        first_https_answer(ng_port, HOT, time.perf_counter())
        proxies = {"switchyard": sy_port, "nginx": ng_port}

        for name, port in proxies.items():
            vegeta(port, 0, 2, False, workers=64)  # warm-up
            r = vegeta(port, 0, seconds, False, workers=64)
            results["handshake_rate"][name] = r
            print(f"handshake rate {name}: {r['achieved_rps']:.0f}/s success {r['success']:.3f}", flush=True)
        for name, port in proxies.items():
            results["latency"][name] = []
            for keepalive in (True, False):
                for rate in RATES:
                    r = vegeta(port, rate, seconds, keepalive)
                    results["latency"][name].append(r)
                    print(f"https {name} @{rate} keepalive={keepalive}: p50 {r['p50_ms']:.3f} "
                          f"p99 {r['p99_ms']:.3f} ms success {r['success']:.3f}", flush=True)
        for p in (sy, ng):
            p.stop()
            started_procs.remove(p)

        for certs in startup_sizes:
            data = seed(work, f"startup-{certs}", certs, certs, b1)
            sy, port, _, started = start_switchyard(work, data, f"startup-{certs}")
            started_procs.append(sy)
            ready = first_https_answer(port, f"app{certs - 1}.bench", started)
            rss_ready = common.rss_kib(sy.pid)
            row = {"certs": certs, "startup_s": ready, "rss_kib": rss_ready}
            if certs == startup_sizes[0]:
                results["cold_vs_warm"] = cold_vs_warm(port, 1000, 300)
            row["rss_after_kib"] = common.rss_kib(sy.pid)
            results["startup"].append(row)
            print(f"startup with {certs} certificates: {ready * 1000:.0f} ms, RSS {rss_ready} KiB", flush=True)
            sy.stop()
            started_procs.remove(sy)
            shutil.rmtree(data, ignore_errors=True)

    return report.finish_section("https", results, args.quick, work)


if __name__ == "__main__":
    sys.exit(main())
