#!/usr/bin/env python3
"""What every benchmark script here is made of: free ports, processes stopped by PID, the
Switchyard, nginx and HAProxy configurations of one app set, the load tools (wrk, vegeta)
and their parsing, and the machine's facts for the reports. The HTTP benchmark itself is
bench_http.py; the report, report.py."""

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


def wait_port(port, timeout=60, host="127.0.0.1"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection((host, port), timeout=0.2).close()
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


class Started(list):
    """The processes a block starts, stopped last-first when it ends, however it ends."""

    def __enter__(self):
        return self

    def __exit__(self, *_):
        for process in reversed(self):
            process.stop()
        return False


def get(port, host, path="/"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def stat_cpu_seconds(stat):
    """utime + stime (fields 14 and 15) of a `/proc/…/stat` text, in seconds."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """utime + stime the process has used, in seconds."""
    return stat_cpu_seconds(Path(f"/proc/{pid}/stat").read_text())


def threads_cpu_seconds(pid, name_prefix):
    """utime + stime of the process's threads whose name starts with `name_prefix`."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        if stat[stat.index("(") + 1:stat.rindex(")")].startswith(name_prefix):
            total += stat_cpu_seconds(stat)
    return total


def process_tree(pid):
    """The process and its children (nginx's workers)."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [pid, *map(int, children)]


def tree_cpu_seconds(pid):
    """utime + stime of the process and its children, in seconds."""
    return sum(cpu_seconds(p) for p in process_tree(pid))


def cpu_per_request(proxies, target, rate, seconds, rounds, label, threads=None):
    """CPU per request at a constant `rate` (vegeta) for each of `proxies` ([(name, port,
    process)]); `target(port)` is vegeta's target text. Alternated `rounds` times, each run
    on a quiet machine: utime + stime of the proxy's processes ÷ requests, in ms, and with
    `threads` (a thread-name prefix) that of those threads too. On two shared cores the
    steadier figure beside closed-loop throughput. {name: [run, …]}"""
    runs = {name: [] for name, _, _ in proxies}
    for round_ in range(rounds):
        for name, port, proc in proxies[::-1] if round_ % 2 else proxies:
            wait_for_quiet()
            process = tree_cpu_seconds(proc.pid)
            named = threads and threads_cpu_seconds(proc.pid, threads)
            attack = subprocess.run([VEGETA, "attack", f"-rate={rate}", f"-duration={seconds}s", "-timeout=5s"],
                                    input=target(port).encode(), check=True, capture_output=True).stdout
            summary = vegeta_summary(attack)
            run = {"cpu_ms": (tree_cpu_seconds(proc.pid) - process) / summary["requests"] * 1e3,
                   "success": summary["success"], "p50_ms": summary["p50_ms"]}
            if threads:
                run["threads_ms"] = (threads_cpu_seconds(proc.pid, threads) - named) / summary["requests"] * 1e3
            runs[name].append(run)
            print(f"{label} {name}: {run['cpu_ms']:.2f} ms CPU per request at {rate}/s"
                  + (f", {threads}* threads {run['threads_ms']:.2f} ms" if threads else "")
                  + f" (success {summary['success']:.3f}, p50 {summary['p50_ms']:.1f} ms)", flush=True)
    return runs


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


# Every GET answered with one fixed answer, head and body in one write: written apart, they
# wait out Nagle and the front's delayed ACK (40 ms a request on keep-alive).
ANSWER_ORIGIN = """
import http.server, sys
BODY = open(sys.argv[2], "rb").read()
FIELDS = "".join(f"{field}\\r\\n" for field in sys.argv[3:])
ANSWER = f"HTTP/1.1 200 OK\\r\\n{FIELDS}Content-Length: {len(BODY)}\\r\\n\\r\\n".encode() + BODY
class Answer(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.wfile.write(ANSWER)
    def log_message(self, *args):
        pass
class Server(http.server.ThreadingHTTPServer):
    # The default backlog of 5 drops connections a front opens at once (300 in
    # bench/http3_network.py's new-connection runs), which then time out as the front's 5xx.
    request_queue_size = 1024
Server(("127.0.0.1", int(sys.argv[1])), Answer).serve_forever()
"""


def start_answer_origin(work, name, body, fields):
    """A Python origin answering every GET with `body` (bytes) and `fields` (header lines
    such as "Content-Type: text/html"); (process, port)."""
    port = free_port()
    (work / f"{name}.body").write_bytes(body)
    (work / f"{name}.py").write_text(ANSWER_ORIGIN)
    proc = Process(name, [sys.executable, str(work / f"{name}.py"), str(port),
                          str(work / f"{name}.body"), *fields], work)
    wait_port(port)
    return proc, port


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


def nginx_proxy_conf(work, name, http, main=""):
    """nginx as the proxy under test: a worker per core in the foreground, its pid and error
    log in `work` under `name`, no access log, room for many server names; `http` ends its
    http block, `main` (e.g. `user root;`) goes before everything."""
    return f"""{main}
worker_processes {THREADS};
daemon off;
pid {work}/{name}.pid;
error_log {work}/{name}-error.log;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    server_names_hash_max_size 1048576;
    server_names_hash_bucket_size 128;
{http}
}}
"""


def nginx_conf(work, port):
    return nginx_proxy_conf(work, "nginx", f"""\
    server {{ listen 127.0.0.1:{port} default_server; return 404; }}
    include {work}/nginx-apps/*.conf;""")


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


def serve_switchyard(work, name, *args, log_level="warn", binary=None, env=None):
    """`switchyard serve` on free ports with its own data directory, no HTTPS listener unless
    `args` name one (the default would take port 8443), no access log and no shutdown grace,
    plus `args`;
    returns (process, http port, admin port). `binary`: another build (an earlier commit's,
    measured beside this one); `env`: more environment variables."""
    http_port, admin_port = free_port(), free_port()
    https = [] if "--https" in args else ["--https", "off"]
    proc = Process(name, [
        str(binary or BIN), "serve", "--http", f"127.0.0.1:{http_port}", *https,
        "--admin", f"127.0.0.1:{admin_port}",
        "--data-dir", str(work / f"{name}-data"), "--access-log", "off", "--shutdown-grace-s", "0",
        *args,
    ], work, env={**os.environ, "RUST_LOG": log_level, **(env or {})})
    wait_port(http_port)
    wait_port(admin_port)
    return proc, http_port, admin_port


def benchmark_pool(pool_mode="threads", pool_sched=None):
    """The environment through which a benchmark asks the router for a comparison of its
    worker pool (`SWITCHYARD_BENCH_POOL`, outside the router's settings): heavy work inline
    on the event loops, or the pool's threads scheduled otherwise than by default."""
    if pool_mode == "inline":
        return {"SWITCHYARD_BENCH_POOL": "inline"}
    return {"SWITCHYARD_BENCH_POOL": pool_sched} if pool_sched else {}


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


def cpu_busy_ticks():
    """(busy, total) clock ticks of all CPUs since boot, from /proc/stat's first line."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def wait_for_quiet(most_s=20, busy_below=0.15):
    """Waits until the machine's CPUs are mostly idle over half a second (at most `most_s`):
    a proxy measured after another still works off the backlog its clients left (nginx +
    ModSecurity inspects bodies it already read after wrk hangs up), and a pool that yields
    the CPU would be measured against that tail."""
    deadline = time.monotonic() + most_s
    before = cpu_busy_ticks()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        after = cpu_busy_ticks()
        busy, total = after[0] - before[0], after[1] - before[1]
        if total and busy / total < busy_below:
            return
        before = after


def answered_2xx_per_s(out):
    """2xx answers per second in a wrk run (its Requests/sec counts every answer, refusals
    such as a busy pool's 503 included)."""
    # "  1234 requests in 12.01s, 5.6MB read"
    total, took = next((int(l.split()[0]), float(l.split()[3].rstrip("s,")))
                       for l in out.splitlines() if " requests in " in l)
    _, errors = parse_wrk(out)
    non_2xx = sum(int(e.split(":")[1]) for e in errors if e.startswith("Non-2xx"))
    return (total - non_2xx) / took


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


def earlier_summary(key, summarise):
    """The section `key` of bench/results/latest.json as `summarise` sums it up, with its
    commit and date, and the earlier runs it carried: a new run keeps the older figures
    beside its own."""
    path = ROOT / "bench" / "results" / "latest.json"
    if not path.exists():
        return []
    results = json.loads(path.read_text())
    section = results.get(key)
    if not section:
        return []
    host = results.get(f"{key}_host") or {}
    earlier = section.get("earlier_runs", [])
    return earlier + [{"commit": host.get("commit", "?"), "date": results.get(f"{key}_date", "?"),
                       **summarise(section)}]


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


def measured_on(nginx=False):
    """How a results section opens: when, on which machine (with nginx's version)."""
    m = machine()
    text = (f"Measured on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {m['cpu']}, "
            f"{m['cores']} cores, kernel {m['kernel']}")
    if nginx:
        text += f", {m['versions']['nginx'].replace('nginx version: ', '')}"
    return text
