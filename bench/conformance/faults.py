#!/usr/bin/env python3
"""Faults injected with toxiproxy. Between each proxy and its app, Switchyard beside nginx in
one run: a backend that is slow, slower than the read deadline, silent, resetting,
down, throttled, sliced into tiny writes, or that closes in the middle of an answer. Each
case checks what the client gets (the right status, a complete body, or a visibly cut one),
that it gets it within a bound (no hang), and at the end that the proxy holds no more
sockets than before (no leaked connection).

Between Switchyard and its Redis store (fleet mode; nginx has no such store): Redis slow,
resetting or down must not touch apps already routed, must make unknown hosts and admin
writes fail fast with 503, and everything must work again when Redis is back.

Both proxies give the app a 1 s connect and 2 s read deadline. Everything listens on
127.0.0.1 and is stopped by PID. Results: the "Backend faults" section of
bench/CONFORMANCE.md and bench/results/faults.json.
"""

import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import ROOT, Process, Started, free_port, put_app, serve_switchyard, wait_port  # noqa: E402
from report import machine, replace_section  # noqa: E402

TOXIPROXY = os.environ.get("TOXIPROXY") or shutil.which("toxiproxy-server") or str(Path.home() / "go" / "bin" / "server")
SECTION = "## Backend faults (bench/conformance/faults.py)"
HOST = "faults.test"
BIG = 1 << 20
CLIENT_TIMEOUT_S = 30


def toxic(kind, stream="downstream", **attributes):
    return {"type": kind, "stream": stream, "attributes": attributes}


# (name, toxics, path, what the client must see, longest acceptable wait in seconds)
CASES = [
    ("backend a little slow (300 ms latency)", [toxic("latency", latency=300)], "/", "200", 3),
    ("backend slower than the 2 s read deadline (3 s latency)", [toxic("latency", latency=3000)], "/", "504", 4.5),
    ("backend accepts and never answers", [toxic("timeout", stream="upstream", timeout=0)], "/", "504", 4.5),
    ("backend resets every connection", [toxic("reset_peer", stream="upstream", timeout=0)], "/", "502", 3),
    ("backend down (connection refused)", "disable", "/", "502", 3),
    ("backend throttled to 256 KB/s, 1 MiB answer", [toxic("bandwidth", rate=256)], "/big.bin", "complete", 12),
    ("backend writes in 1 KB slices every 2 ms, 1 MiB answer",
     [toxic("slicer", average_size=1024, size_variation=512, delay=2000)], "/big.bin", "complete", 12),
    ("backend closes after 100 KB of a 1 MiB answer", [toxic("limit_data", bytes=100_000)], "/big.bin", "cut", 5),
]


class Toxiproxy:
    def __init__(self, work):
        self.port = free_port()
        self.proc = Process("toxiproxy", [TOXIPROXY, "-host", "127.0.0.1", "-port", str(self.port)], work)
        wait_port(self.port)

    def call(self, method, path, body=None):
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method,
                                         data=json.dumps(body).encode() if body is not None else None,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read()
            return json.loads(text) if text else None

    def proxy(self, name, upstream):
        listen = free_port()
        self.call("POST", "/proxies", {"name": name, "listen": f"127.0.0.1:{listen}",
                                       "upstream": f"127.0.0.1:{upstream}", "enabled": True})
        return listen

    def apply(self, name, toxics):
        if toxics == "disable":
            self.call("POST", f"/proxies/{name}", {"enabled": False})
            return
        for i, t in enumerate(toxics):
            self.call("POST", f"/proxies/{name}/toxics", {**t, "name": f"t{i}"})

    def clear(self, name):
        self.call("POST", f"/proxies/{name}", {"enabled": True})
        for t in self.call("GET", f"/proxies/{name}/toxics") or []:
            self.call("DELETE", f"/proxies/{name}/toxics/{t['name']}")


def start_backend(work):
    port = free_port()
    root = work / "site"
    root.mkdir(exist_ok=True)
    (root / "index.html").write_text("faults backend\n")
    (root / "big.bin").write_bytes(os.urandom(BIG))
    proc = Process("backend", ["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", str(root)], work)
    wait_port(port)
    return proc, port


def start_switchyard(work, upstream):
    proc, http_port, admin = serve_switchyard(work, "switchyard", "--waf", "off")
    put_app(admin, "faults", {"domains": [HOST], "backends": [f"127.0.0.1:{upstream}"],
                              "timeouts": {"connect_ms": 1000, "read_ms": 2000, "write_ms": 2000}})
    return proc, http_port


def start_nginx(work, upstream):
    port = free_port()
    conf = work / "nginx-faults.conf"
    conf.write_text(f"""
worker_processes 2;
daemon off;
pid {work}/nginx-faults.pid;
error_log {work}/nginx-faults-error.log;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    upstream app {{ server 127.0.0.1:{upstream}; keepalive 16; }}
    server {{
        listen 127.0.0.1:{port};
        server_name {HOST};
        location / {{
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_connect_timeout 1s;
            proxy_read_timeout 2s;
            proxy_send_timeout 2s;
        }}
    }}
}}
""")
    proc = Process("nginx-faults", ["nginx", "-c", str(conf), "-p", str(work)], work)
    wait_port(port)
    return proc, port


def open_sockets(pid):
    """Sockets held by a process and its children (nginx's workers)."""
    pids = [pid] + [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                                     text=True).stdout.split()]
    count = 0
    for p in pids:
        fd_dir = Path(f"/proc/{p}/fd")
        for fd in fd_dir.iterdir():
            try:
                if os.readlink(fd).startswith("socket:"):
                    count += 1
            except OSError:
                pass
    return count


def request(port, path, host=HOST):
    """Status, body bytes, the declared length, and whether the read ended in an error."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT_S)
    started = time.time()
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        declared = response.getheader("content-length")
        try:
            body = response.read()
            broken = False
        except http.client.IncompleteRead as e:
            body, broken = e.partial, True
        except OSError:
            body, broken = b"", True
        return response.status, len(body), declared, broken, time.time() - started
    except (OSError, http.client.HTTPException) as e:
        return f"error: {type(e).__name__}", 0, None, True, time.time() - started
    finally:
        conn.close()


def judge(expect, status, length, declared, broken, elapsed, bound):
    if elapsed > bound:
        return False, f"took {elapsed:.1f} s (bound {bound} s)"
    if expect == "complete":
        ok = status == 200 and length == BIG and not broken
        return ok, f"{status}, {length} bytes in {elapsed:.1f} s"
    if expect == "cut":
        # Either refused outright, or the body visibly cut short: never a clean, short 200.
        ok = status in (502, 504) or broken or (declared is not None and int(declared) != length)
        return ok, f"{status}, {length} of {declared} bytes, {'cut' if broken else 'ended'} in {elapsed:.1f} s"
    return str(status) == expect, f"{status} in {elapsed:.1f} s"


def run_cases(name, start, toxiproxy, backend, work):
    upstream = toxiproxy.proxy(name, backend)
    proxy, port = start(work, upstream)
    try:
        request(port, "/")  # warm: connections pooled, route cached
        time.sleep(0.5)
        sockets_before = open_sockets(proxy.pid)
        rows = []
        for case, toxics, path, expect, bound in CASES:
            toxiproxy.apply(name, toxics)
            status, length, declared, broken, elapsed = request(port, path)
            toxiproxy.clear(name)
            passed, seen = judge(expect, status, length, declared, broken, elapsed, bound)
            rows.append({"case": case, "expect": expect, "seen": seen, "passed": passed})
        # After the faults, the app answers again through the same proxy.
        recovered = request(port, "/")[0] == 200
        time.sleep(3)
        sockets_after = open_sockets(proxy.pid)
        return {"rows": rows, "recovered": recovered, "sockets_before": sockets_before,
                "sockets_after": sockets_after, "alive": proxy.proc.poll() is None}
    finally:
        proxy.stop()


def admin_put(admin, name, spec):
    """Status and seconds of an admin PUT (an error status is an answer, not an exception)."""
    started = time.time()
    request = urllib.request.Request(f"http://127.0.0.1:{admin}/v1/apps/{name}", data=json.dumps(spec).encode(),
                                     method="PUT", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=CLIENT_TIMEOUT_S) as response:
            status = response.status
    except urllib.error.HTTPError as e:
        status = e.code
    except OSError as e:
        status = f"error: {type(e).__name__}"
    return status, time.time() - started


REDIS_FAULTS = [
    ("Redis 3 s slower than usual", [toxic("latency", latency=3000), toxic("latency", stream="upstream", latency=3000)]),
    ("Redis resets every connection", [toxic("reset_peer", stream="upstream", timeout=0)]),
    ("Redis down (connection refused)", "disable"),
]
REDIS_TIMEOUT_MS = 300


def run_redis_cases(toxiproxy, backend, work):
    redis_port = free_port()
    redis = Process("redis", ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no"], work)
    wait_port(redis_port)
    store_port = toxiproxy.proxy("redis", redis_port)
    try:
        router, http_port, admin = serve_switchyard(
            work, "switchyard-fleet", "--waf", "off", "--store", f"redis://127.0.0.1:{store_port}/0",
            "--redis-timeout-ms", str(REDIS_TIMEOUT_MS))
    except BaseException:
        redis.stop()
        raise
    try:
        app = lambda domain: {"domains": [domain], "backends": [f"127.0.0.1:{backend}"]}
        admin_put(admin, "known", app("known.test"))
        rows = []
        for n, (case, toxics) in enumerate(REDIS_FAULTS):
            warm = request(http_port, "/", "known.test")[0] == 200
            toxiproxy.apply("redis", toxics)
            time.sleep(0.2)
            known = request(http_port, "/", "known.test")
            unknown = request(http_port, "/", f"never-seen-{n}.test")
            write = admin_put(admin, f"new{n}", app(f"new{n}.test"))
            toxiproxy.clear("redis")
            bound = 3 * REDIS_TIMEOUT_MS / 1000 + 1
            checks = [
                (warm and known[0] == 200 and known[4] < 0.5, f"routed app: {known[0]} in {known[4]:.2f} s"),
                (unknown[0] == 503 and unknown[4] < bound, f"unknown host: {unknown[0]} in {unknown[4]:.2f} s"),
                (write[0] == 503 and write[1] < bound, f"admin write: {write[0]} in {write[1]:.2f} s"),
            ]
            rows.append({"case": case, "passed": all(ok for ok, _ in checks),
                         "seen": "; ".join(("✅ " if ok else "❌ ") + text for ok, text in checks)})
        # Back: writes are taken and routed again.
        deadline = time.time() + 10
        recovered = False
        while time.time() < deadline and not recovered:
            recovered = admin_put(admin, "after", app("after.test"))[0] == 200
            time.sleep(0.2)
        recovered = recovered and request(http_port, "/", "after.test")[0] == 200
        return {"rows": rows, "recovered": recovered, "alive": router.proc.poll() is None,
                "redis_timeout_ms": REDIS_TIMEOUT_MS}
    finally:
        router.stop()
        redis.stop()


def write_section(results):
    s, n = results["switchyard"], results["nginx"]
    lines = [SECTION, "",
             f"Measured on {results['date']}, {results['machine']}. toxiproxy {results['toxiproxy']} between each proxy and "
             "the app (python's http.server); the app's deadlines: connect 1 s, read 2 s. What the "
             "client saw, and whether it is right:", "",
             f"| case | expected | Switchyard | nginx {results['nginx_version']} |", "|---|---|---|---|"]
    for a, b in zip(s["rows"], n["rows"]):
        mark = lambda r: ("✅ " if r["passed"] else "❌ ") + r["seen"]
        lines.append(f"| {a['case']} | {a['expect']} | {mark(a)} | {mark(b)} |")
    for key, label in (("recovered", "answers again once the faults are gone"),):
        lines.append(f"| {label} | 200 | {'✅' if s[key] else '❌'} | {'✅' if n[key] else '❌'} |")
    lines.append(f"| sockets held before → 3 s after the faults | no growth | {s['sockets_before']} → "
                 f"{s['sockets_after']} | {n['sockets_before']} → {n['sockets_after']} |")
    passed = lambda r: sum(x["passed"] for x in r["rows"]) + r["recovered"] + (r["sockets_after"] <= r["sockets_before"])
    total = len(CASES) + 2
    lines += ["", f"Fault cases passed: Switchyard {passed(s)}/{total}, nginx {passed(n)}/{total}. "
              "`cut` means the client must be able to tell the answer is incomplete (a 502/504, or a "
              "body shorter than its Content-Length / a broken chunked stream), never a clean short 200."]
    r = results["redis"]
    lines += ["", f"Between Switchyard and its Redis store (`--store redis://…`, `--redis-timeout-ms "
              f"{r['redis_timeout_ms']}`): an app routed before the fault, a host never seen, and an admin "
              "write, during each fault:", "", "| fault | Switchyard |", "|---|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['case']} | {row['seen']} |")
    lines.append(f"| Redis back: a write is taken and routed | {'✅' if r['recovered'] else '❌'} |")
    lines += ["", f"Redis fault cases passed: {sum(x['passed'] for x in r['rows']) + r['recovered']}/"
              f"{len(r['rows']) + 1}."]
    replace_section(SECTION, lines)
    return lines


def main():
    work = Path(tempfile.mkdtemp(prefix="switchyard-faults-"))
    with Started() as procs:
        backend_proc, backend = start_backend(work)
        procs.append(backend_proc)
        toxiproxy = Toxiproxy(work)
        procs.append(toxiproxy.proc)
        version = toxiproxy.call("GET", "/version")
        results = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": machine(),
            "toxiproxy": os.environ.get("TOXIPROXY_VERSION")
            or (version.get("version") if isinstance(version, dict) else version),
            "nginx_version": subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip().split("/")[-1],
            "switchyard": run_cases("switchyard", start_switchyard, toxiproxy, backend, work),
            "nginx": run_cases("nginx", start_nginx, toxiproxy, backend, work),
            "redis": run_redis_cases(toxiproxy, backend, work),
        }
    shutil.rmtree(work, ignore_errors=True)
    (ROOT / "bench" / "results" / "faults.json").write_text(json.dumps(results, indent=2) + "\n")
    print("\n".join(write_section(results)))


if __name__ == "__main__":
    main()
