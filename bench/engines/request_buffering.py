#!/usr/bin/env python3
"""Request buffering beside nginx (issue 72, part 4).

1. Slow uploads against an app with 4 workers (a Unicorn-like origin: 4 threads, each
   reading one whole request, answering, closing): fast GETs at --fast-rate for
   --seconds, alone and then while --uploads clients each send a --upload-kb body at
   1 KB/s. Through Switchyard buffering (the default), Switchyard with the app's
   `"request_buffering": false`, and nginx with its defaults (`proxy_request_buffering
   on`), one after the other in one run: the fast requests' success rate and p99, and
   how the slow uploads ended.
2. CPU per request for a 1 MB upload at a constant rate (vegeta POST, a Python origin
   that reads each body whole): Switchyard buffering (spooled: 1 MB is past the 64 KiB kept
   in memory), Switchyard streaming (what the spool costs is the difference), nginx
   (its defaults spool past client_body_buffer_size, 16 KiB here). utime+stime of each
   proxy's processes ÷ requests, rounds alternated.

    python3 bench/engines/request_buffering.py --binary target/ci/switchyard

Needs vegeta and nginx (bench/run installs them). Prints tables for
bench/REQUEST_BUFFERING.md.
"""

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import bench  # noqa: E402
import filters as F  # noqa: E402
import instructions as I  # noqa: E402

# Four workers, each serving one whole request per connection as Unicorn's do: while one
# reads a slow body, it serves nobody else.
WORKERS = r"""
import socket, sys, threading
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", int(sys.argv[1])))
listener.listen(1024)
def read_request(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        more = conn.recv(65536)
        if not more:
            return False
        data += more
    head, rest = data.split(b"\r\n\r\n", 1)
    fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
    fields = {k.strip().lower(): v.strip() for k, v in fields.items()}
    if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
        while not rest.endswith(b"0\r\n\r\n"):
            more = conn.recv(65536)
            if not more:
                return False
            rest += more
    else:
        left = int(fields.get(b"content-length", b"0")) - len(rest)
        while left > 0:
            more = conn.recv(min(left, 65536))
            if not more:
                return False
            left -= len(more)
    return True
def work():
    while True:
        conn, _ = listener.accept()
        try:
            conn.settimeout(120)
            if read_request(conn):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")
        except OSError:
            pass
        finally:
            conn.close()
threads = [threading.Thread(target=work, daemon=True) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""

# Slow clients: each sends a body of KB kilobytes at 1 KB a second, then reads the answer.
UPLOADERS = r"""
import asyncio, json, sys
port, host, clients, kb = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
async def upload():
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"POST /upload HTTP/1.1\r\nHost: {host}\r\nContent-Length: {kb * 1024}\r\n\r\n".encode())
        for _ in range(kb):
            writer.write(b"u" * 1024)
            await writer.drain()
            await asyncio.sleep(1)
        line = await asyncio.wait_for(reader.readline(), 120)
        writer.close()
        return line.split(b" ")[1].decode() if line else "closed"
    except Exception as e:
        return type(e).__name__
async def main():
    results = await asyncio.gather(*(upload() for _ in range(clients)))
    counts = {}
    for r in results:
        counts[r] = counts.get(r, 0) + 1
    print(json.dumps(counts))
asyncio.run(main())
"""


# An origin that reads each body whole before it answers, over keep-alive: one that
# answered first (nginx's `return 200`) would cut streamed uploads short.
READING = r"""
import http.server, sys
class Reading(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        left = int(self.headers.get("content-length", "0"))
        while left > 0:
            left -= len(self.rfile.read(min(left, 1 << 16)))
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
    def log_message(self, *args):
        pass
class Server(http.server.ThreadingHTTPServer):
    request_queue_size = 1024
Server(("127.0.0.1", int(sys.argv[1])), Reading).serve_forever()
"""


def python_origin(work, name, script):
    """`script` (WORKERS or READING) listening on a free port: (process, port)."""
    port = bench.free_port()
    (work / f"{name}.py").write_text(script)
    proc = bench.Process(name, [sys.executable, str(work / f"{name}.py"), str(port)], work)
    bench.wait_port(port)
    return proc, port


def fast(port, host, rate, seconds):
    """Fast GETs at `rate` for `seconds` (vegeta, 5 s timeout): success and p99 (ms)."""
    attack = subprocess.run(
        [bench.VEGETA, "attack", f"-rate={rate}", f"-duration={seconds}s", "-timeout=5s"],
        input=f"GET http://127.0.0.1:{port}/fast\nHost: {host}\n".encode(),
        capture_output=True, check=True).stdout
    return bench.vegeta_summary(attack)


def slow_uploads(work, port, host, args):
    script = work / "uploaders.py"
    script.write_text(UPLOADERS)
    return subprocess.Popen([sys.executable, str(script), str(port), host, str(args.uploads),
                             str(args.upload_kb)], stdout=subprocess.PIPE, text=True)


def nginx_front(work, name, backend_port, port):
    conf = work / f"{name}.conf"
    conf.write_text(bench.nginx_proxy_conf(work, name, f"""
    client_body_temp_path {work}/{name}-body;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        client_max_body_size 2m;
        location / {{
            proxy_pass http://127.0.0.1:{backend_port};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}""", main="user root;"))
    proc = bench.Process(name, ["nginx", "-c", str(conf), "-p", str(work)], work)
    bench.wait_port(port)
    return proc


def slow_upload_rows(work, args):
    rows = []
    routers = []
    try:
        router, port, admin = F.start(work, "buffering", threads=2)
        routers.append(router)
        fronts = []
        for label, options in [("switchyard, buffering (default)", {}),
                               ("switchyard, request_buffering: false", {"request_buffering": False})]:
            origin, origin_port = python_origin(work, f"workers-{len(fronts)}", WORKERS)
            routers.append(origin)
            host = f"app{len(fronts)}.test"
            F.admin_call(admin, "PUT", f"/v1/apps/app{len(fronts)}",
                         {"domains": [host], "backends": [f"127.0.0.1:{origin_port}"], **options})
            fronts.append((label, port, host))
        origin, origin_port = python_origin(work, "workers-nginx", WORKERS)
        routers.append(origin)
        nginx_port = bench.free_port()
        routers.append(nginx_front(work, "nginx-front", origin_port, nginx_port))
        fronts.append(("nginx 1.22, defaults", nginx_port, "nginx.test"))
        for label, front_port, host in fronts:
            bench.wait_for_quiet()
            alone = fast(front_port, host, args.fast_rate, args.seconds)
            uploads = slow_uploads(work, front_port, host, args)
            time.sleep(3)
            beside = fast(front_port, host, args.fast_rate, args.seconds)
            ended = json.loads(uploads.communicate(timeout=args.upload_kb + 180)[0] or "{}")
            row = {"front": label, "alone": alone, "beside": beside, "uploads": ended}
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        for proc in routers:
            proc.stop()
    return rows


def cpu_rows(work, args):
    body = work / "upload.bin"
    body.write_bytes(b"m" * (1 << 20))
    origin, origin_port = python_origin(work, "reading-origin", READING)
    procs = [origin]
    try:
        router, port, admin = F.start(work, "cpu", threads=2)
        procs.append(router)
        for name, options in [("spooled", {}), ("streamed", {"request_buffering": False})]:
            F.admin_call(admin, "PUT", f"/v1/apps/{name}",
                         {"domains": [f"{name}.test"], "backends": [f"127.0.0.1:{origin_port}"],
                          **options})
        nginx_port = bench.free_port()
        nginx = nginx_front(work, "nginx-cpu", origin_port, nginx_port)
        procs.append(nginx)
        runs = {}
        for label, front_port, host in [("switchyard, buffered (spooled)", port, "spooled.test"),
                                         ("switchyard, streamed", port, "streamed.test"),
                                         ("nginx 1.22, defaults", nginx_port, "cpu.test")]:
            target = f"POST http://127.0.0.1:{front_port}/up\nHost: {host}\n@{body}\n"
            measured = bench.cpu_per_request([(label, front_port, router if front_port == port else nginx)],
                                             lambda _p, t=target: t, args.cpu_rate, args.cpu_seconds,
                                             args.rounds, "1 MB upload")
            runs[label] = measured[label]
        return {label: {"cpu_ms": statistics.median(r["cpu_ms"] for r in rs),
                        "success": min(r["success"] for r in rs)} for label, rs in runs.items()}
    finally:
        for proc in procs:
            proc.stop()


def posts(port, host, body, requests, rate):
    """`requests` POSTs of `body` (a file) at `rate`/s over keep-alive; how many succeeded."""
    target = f"POST http://127.0.0.1:{port}/up\nHost: {host}\n@{body}\n"
    attack = subprocess.run(
        [bench.VEGETA, "attack", f"-rate={rate}", f"-duration={requests / rate}s", "-timeout=30s",
         "-keepalive=true", "-connections=4", "-workers=4", "-max-workers=4"],
        input=target.encode(), check=True, capture_output=True).stdout
    summary = bench.vegeta_summary(attack)
    return int(round(summary["requests"] * summary["success"]))


def instruction_rows(work, args):
    """Instructions per upload under callgrind (one event loop; the blocking threads that
    write and read the spool counted too): a run of a few uploads and one of as many more,
    the difference over the difference."""
    origin, origin_port = python_origin(work, "callgrind-origin", READING)
    measured = {}
    try:
        # Small bodies cost little beside a router's start: many more of them, faster.
        for size, label, scale in [(1 << 20, "1 MB", 1), (4096, "4 KB", 10)]:
            body = work / f"body-{size}"
            body.write_bytes(b"i" * size)
            for host, options, how in [("buffered.test", {}, "buffered"),
                                       ("streamed.test", {"request_buffering": False}, "streamed")]:
                totals = []
                for requests in (20, 20 + args.callgrind_requests * scale):
                    out = work / f"{how}-{size}-{requests}.callgrind"
                    proc, port, admin = F.start(work, "callgrind", wrap=I.valgrind("callgrind", out),
                                                threads=1)
                    try:
                        F.admin_call(admin, "PUT", f"/v1/apps/{how}",
                                     {"domains": [host], "backends": [f"127.0.0.1:{origin_port}"],
                                      **options})
                        answered = posts(port, host, body, requests, args.callgrind_rate * scale)
                    finally:
                        proc.stop()
                    time.sleep(0.5)
                    totals.append((answered, I.total("callgrind", out, None)[0]))
                (few, few_total), (many, many_total) = totals
                per = (many_total - few_total) / max(many - few, 1)
                measured[f"{label} upload, {how}"] = per
                print(f"{label} upload, {how}: {per:,.0f} instructions per request", flush=True)
    finally:
        origin.stop()
    return measured


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", default=str(bench.BIN))
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--fast-rate", type=int, default=20)
    parser.add_argument("--uploads", type=int, default=200)
    parser.add_argument("--upload-kb", type=int, default=30)
    parser.add_argument("--cpu-rate", type=int, default=20)
    parser.add_argument("--cpu-seconds", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--callgrind-requests", type=int, default=100)
    parser.add_argument("--callgrind-rate", type=int, default=5)
    parser.add_argument("--skip", choices=["uploads", "cpu", "instructions"], action="append",
                        default=[])
    args = parser.parse_args()
    bench.BIN = Path(args.binary)
    print(bench.measured_on(nginx=True), flush=True)
    with tempfile.TemporaryDirectory(prefix="request-buffering-") as tmp:
        work = Path(tmp)
        if "uploads" not in args.skip:
            rows = slow_upload_rows(work, args)
            print("\n| front | fast p99 alone | fast success alone | fast p99 beside 200 slow uploads "
                  "| fast success beside | slow uploads' answers |")
            print("|---|---|---|---|---|---|")
            for row in rows:
                a, b = row["alone"], row["beside"]
                print(f"| {row['front']} | {a['p99_ms']:.1f} ms | {a['success']:.1%} | "
                      f"{b['p99_ms']:.1f} ms | {b['success']:.1%} | {row['uploads']} |")
        if "cpu" not in args.skip:
            cpu = cpu_rows(work, args)
            print(f"\n| 1 MB upload at {args.cpu_rate}/s | CPU per request | success |")
            print("|---|---|---|")
            for label, row in cpu.items():
                print(f"| {label} | {row['cpu_ms']:.2f} ms | {row['success']:.1%} |")
        if "instructions" not in args.skip:
            counted = instruction_rows(work, args)
            print("\n| upload | instructions per request |")
            print("|---|---|")
            for label, per in counted.items():
                print(f"| {label} | {per:,.0f} |")


if __name__ == "__main__":
    main()
