#!/usr/bin/env python3
"""Response cache: seed 004's experiment, Switchyard beside nginx `proxy_cache`.

A deliberately slow app (one request at a time, 10 ms per 5 KB HTML page, like a single
Rails worker) behind:
- Switchyard without a cache,
- Switchyard with its memory cache,
- Switchyard with the shared `redis` store (copies kept in Redis by the router),
- Switchyard with the `redis-versioned` store, the page written to Redis the way seed 004's
  Rails module writes it (`resource_versions` hash + `FULL_URL:version=0`),
- nginx with `proxy_cache` (a keys zone, 60 s validity).

Load: closed loop with 100 connections (`wrk -t2 -c100`, the article's `ab -c 100` made
time-bound; each setup three times, interleaved, median reported) and a constant 2,000 req/s
(vegeta) for latency. Results go to
bench/results/latest.json under "cache" and to bench/RESULTS.md.
"""

import json
import subprocess
import sys
import urllib.request

import bench as common
import report

HOST = "site.bench"
PAGE_PATH = "/foo/1"
RATE = 2000
ROUNDS = 3


SLOW_APP = """
import http.server, sys, time
PAGE = b"<p>a slow page</p>" * 300
class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(0.01)
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)
    def log_message(self, *args):
        pass
class Server(http.server.HTTPServer):
    request_queue_size = 4096
Server(("127.0.0.1", int(sys.argv[1])), Page).serve_forever()
"""


def start_slow_app(work, port=None):
    """One request at a time, 10 ms each: a single app worker, as a Rails process is."""
    port = port or common.free_port()
    script = work / "slow_app.py"
    script.write_text(SLOW_APP)
    proc = common.Process("slow-app", [sys.executable, str(script), str(port)], work)
    common.wait_port(port)
    return proc, port


def start_nginx_cache(work, app_port):
    port = common.free_port()
    conf = work / "nginx-cache.conf"
    (work / "nginx-cache").mkdir(exist_ok=True)
    conf.write_text(f"""
user root;
worker_processes {common.THREADS};
daemon off;
pid {work}/nginx-cache.pid;
error_log {work}/nginx-cache-error.log;
events {{ worker_connections 16384; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    proxy_cache_path {work}/nginx-cache keys_zone=pages:10m max_size=256m;
    upstream app {{ server 127.0.0.1:{app_port}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_cache pages;
            proxy_cache_key $host$request_uri;
            proxy_cache_valid 200 60s;
            proxy_cache_lock on;
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
        }}
    }}
}}
""")
    proc = common.Process("nginx-cache", ["nginx", "-c", str(conf), "-p", str(work)], work)
    common.wait_port(port)
    return proc, port


def put_app(admin_port, app_port, cache):
    spec = {"domains": [HOST], "backends": [f"127.0.0.1:{app_port}"]}
    if cache:
        spec["cache"] = cache
    request = urllib.request.Request(f"http://127.0.0.1:{admin_port}/v1/apps/site", method="PUT",
                                     data=json.dumps(spec).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def constant_rate(port, seconds):
    target = f"GET http://127.0.0.1:{port}{PAGE_PATH}\nHost: {HOST}\n"
    out = subprocess.run([common.VEGETA, "attack", f"-rate={RATE}", f"-duration={seconds}s", "-timeout=5s"],
                         input=target.encode(), check=True, capture_output=True).stdout
    return common.vegeta_summary(out)


def measure(work, seconds, procs):
    results = {"seconds": seconds, "rate": RATE, "runs": []}
    app, app_port = start_slow_app(work)
    procs.append(app)
    redis_port = common.free_port()
    redis = common.Process("cache-redis", [
        "redis-server", "--bind", "127.0.0.1", "--port", str(redis_port), "--save", "",
        "--appendonly", "no", "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru"], work)
    procs.append(redis)
    common.wait_port(redis_port)
    url = f"http://{HOST}{PAGE_PATH}"
    page = common.get(app_port, HOST, PAGE_PATH)[1]
    # The app's side of seed 004: version 0, then the page under FULL_URL:version=0.
    subprocess.run(["redis-cli", "-p", str(redis_port), "HSET", "resource_versions", url, "0"],
                   check=True, capture_output=True)
    subprocess.run(["redis-cli", "-p", str(redis_port), "-x", "SET", f"{url}:version=0"],
                   input=page, check=True, capture_output=True)

    http_port, admin_port = common.free_port(), common.free_port()
    sy = common.Process("switchyard-cache", [
        str(common.BIN), "serve", "--http", f"127.0.0.1:{http_port}", "--https", "off",
        "--admin", f"127.0.0.1:{admin_port}", "--data-dir", str(work / "data"),
        "--threads", str(common.THREADS), "--access-log", "off", "--shutdown-grace-s", "0",
        "--cache-redis", f"redis://127.0.0.1:{redis_port}/0"], work,
        env={"RUST_LOG": "warn", "PATH": "/usr/bin:/bin"})
    procs.append(sy)
    common.wait_port(http_port)
    common.wait_port(admin_port)
    setups = [
        ("switchyard, memory cache", {"paths": ["/*"], "default_ttl_s": 60}),
        ("switchyard, redis (shared)", {"store": "redis", "paths": ["/*"], "default_ttl_s": 60}),
        ("switchyard, redis-versioned", {"store": "redis-versioned", "paths": ["/*"]}),
    ]

    # Uncached: the app's own queue is what is measured, once.
    put_app(admin_port, app_port, None)
    common.get(http_port, HOST, PAGE_PATH)
    rps, errors = common.wrk_throughput(http_port, seconds, host=HOST, path=PAGE_PATH, connections=100)
    results["runs"].append({"setup": "switchyard, no cache", "rps": rps, "errors": errors})
    print(f"{'switchyard, no cache':32} {rps:9.0f} req/s {errors}", flush=True)
    # A fresh app: nothing left queued from the uncached run.
    app.stop()
    procs.remove(app)
    app, app_port = start_slow_app(work, app_port)
    procs.append(app)
    ng, ng_port = start_nginx_cache(work, app_port)
    procs.append(ng)

    def select(name):
        """Points traffic at one setup and returns its port, warmed."""
        if name == "nginx proxy_cache":
            port = ng_port
        else:
            put_app(admin_port, app_port, dict(setups)[name])
            port = http_port
        for _ in range(2):
            common.get(port, HOST, PAGE_PATH)
        return port

    # Two processes share two cores with the load generator, so one run swings by ±20%:
    # every setup is measured ROUNDS times, interleaved, and the median reported.
    names = [name for name, _ in setups] + ["nginx proxy_cache"]
    samples = {name: [] for name in names}
    for round_number in range(ROUNDS):
        for name in names:
            port = select(name)
            samples[name].append(common.wrk_throughput(port, seconds, host=HOST, path=PAGE_PATH,
                                                       connections=100))
            print(f"round {round_number + 1}: {name:32} {samples[name][-1][0]:9.0f} req/s",
                  flush=True)
    for name in names:
        runs = sorted(rps for rps, _ in samples[name])
        errors = sorted({e for _, errs in samples[name] for e in errs})
        latency = constant_rate(select(name), seconds)
        results["runs"].append({"setup": name, "rps": runs[len(runs) // 2], "rps_runs": runs,
                                "errors": errors, **latency})
        print(f"{name:32} median {runs[len(runs) // 2]:9.0f} req/s {errors} | {latency}", flush=True)
    return results


if __name__ == "__main__":
    sys.exit(report.run_section("cache", __doc__, measure))
